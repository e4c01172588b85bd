"""The daemon: one asyncio loop that only routes. A TaskGroup owns every loop; each loop
runs supervised (a failing iteration is logged once, retried with backoff and shown in
health and STATUS=, never fatal); discovery, /proc and /sys, SQLite, NVML, file exports
and name-service lookups run in worker threads. HostState owns the host's state, the
LeaseService the leases; tasks are told of changes through listeners. What it tells about
itself (health, reports, STATUS=) is a DaemonReports it holds (topod.service.daemon_reports).
The loops are the daemon's own methods (the "loops" section below): they read its config,
lease service, host state, bus and notifier, and nothing else holds them.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from typing import Any

import structlog

from topod import __version__
from topod.alloc.service_request import parse_pid_max
from topod.api.peer import GROUPS, group_id
from topod.config import Config, cpus, load_config
from topod.errors import ConfigError
from topod.events import EventBus
from topod.host import HostRoot
from topod.service.container import detect_container, irq_writes_withheld
from topod.service.daemon_reports import DaemonReports
from topod.discover.memo import DiscoveryMemo
from topod.service.heap import freeze_long_lived
from topod.service.hotplug import HotplugSource, discover_checked, udev_settings
from topod.service.lease_store import LeaseStore
from topod.service.leases import LeaseService
from topod.service.load import NodeLoadSampler
from topod.service.nccl_files import NcclFiles
from topod.service.notify import Notifier
from topod.service.probe_task import probes_this_root
from topod.service.state import HostState
from topod.service.statelock import StateDirLock
from topod.service.supervise import Backoff, supervise
from topod.service.watchdog import Supervisor, run_watchdog, watchdog_interval

log = structlog.get_logger("topod")

GIL_SWITCH_SECONDS = 0.0005
LOG_OWN_FIELDS = frozenset({"level", "timestamp", "logger", "exception", "exc_info"})
LEASE_EVENTS = ("lease_granted", "lease_released", "lease_revoked")
# Events that are more than information in the journal (PRIORITY= follows the level).
EVENT_LEVELS = {"loop_failed": "error", "lease_degraded": "warning", "config_rejected": "error",
                "config_restart_required": "warning", "loop_stalled": "error",
                "request_rejected": "warning",
                "irq_writes_impossible": "warning", "irq_move_failed": "warning"}
REAP_INTERVAL = 1.0
# With no lease and no waiting request nothing can expire, lose its owner or be abandoned:
# the reaper then sleeps until a grant or a queued request (or this long, its watchdog beat)
# instead of waking every second on an idle host (each wake-up costs idle CPU).
REAP_IDLE_SECONDS = 20.0
LOAD_INTERVAL = 10.0
# Isolation with no CPU leased and nothing narrowed to give back waits for a lease change
# (or this long, its beat) instead of a worker-thread round every [isolate] interval.
ISOLATE_IDLE_SECONDS = 20.0
EXPORTS_IDLE_SECONDS = 60.0
# The API's beat: a request over its own connection, through the whole HTTP stack. Each
# cost the idle daemon ~3-4 ms (a cold wake-up); every 10 s rather than 5 s halves that
# idle CPU and leaves the loop's stall deadline as it was (60 s).
LIVENESS_INTERVAL = 10.0
LIVENESS_TIMEOUT = 10.0


class Daemon:
    def __init__(self, config: Config, *, config_path: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.config_error: str | None = None
        self.host = HostRoot(config.get("daemon", "root"))
        self.bus = EventBus()
        self.bus.add_listener(self._log_event)
        self.started = time.time()
        self._discovery_memo = DiscoveryMemo()  # the rescan loop's alone
        self.state = HostState(discover_checked(self.host, self._discovery_memo))
        self.allowed_group = group_id(config.get("daemon", "group"))
        # One daemon per state directory, before the lease database is opened.
        self.state_lock = StateDirLock.acquire(config.get("daemon", "state_dir"))
        self.store = LeaseStore(config.get("daemon", "state_dir"), config.get("daemon", "sqlite_synchronous"))
        self.alloc = LeaseService(self.state, self.store, self.bus, config.section("alloc"), self._reserved_cpus(),
                                  pid_max=parse_pid_max(self.host.read("proc/sys/kernel/pid_max")))
        self.nccl = NcclFiles(self.host, lambda: self.state.topology, lambda: self.config)
        self.alloc.files = self.nccl
        self.state.add_listener(self._state_changed)
        self.reports = DaemonReports(self)
        self.bus.add_listener(self._on_event)
        self.supervisor = Supervisor()
        self.notifier = Notifier()
        self.irq = None
        self.probe = None
        self.hotplug: HotplugSource | None = None
        self.api_address: str | None = None
        self.api_gate = None  # the API's ConnectionGate, set by serve()
        self.api_site = None
        self._own_connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._gpu_addresses = {gpu.address for gpu in self.state.topology.gpus}
        self.container = detect_container(self.host)
        from topod.enforce import host_enforcement

        self.enforcement = host_enforcement(self.host)
        self.alloc.host_enforcement = self.enforcement.mode
        from topod.service.lease_scope import LeaseScopes

        self.scopes = LeaseScopes(self.alloc, lambda: (self.enforcement.mode, self.enforcement.reason),
                                  self._gpu_numbers, self.bus.publish)
        from topod.service.isolation_task import IsolationTask

        self.isolate = IsolationTask(self.host, config.get("daemon", "state_dir"), self.enforcement,
                                     lambda: self.config, lambda: self.state.topology.online_cpus)
        self._isolate_due = asyncio.Event()
        self._load = NodeLoadSampler(self.host)
        self._tasks: asyncio.TaskGroup | None = None
        self._loops: dict[str, asyncio.Task] = {}
        self._stop = asyncio.Event()
        self._reload_lock = asyncio.Lock()  # SIGHUP and POST /v1/reload: one at a time
        self._rescan_now = asyncio.Event()
        self._reap_due = asyncio.Event()
        self._exports_due = asyncio.Event()
        self._exports_due.set()  # write the NCCL file once at start

    @property
    def topology(self):
        return self.state.topology

    # -- what it tells about itself (the API's Backend; topod.service.daemon_reports) ----
    def topology_json(self) -> dict:
        return self.reports.topology_json()

    async def topology_body(self) -> bytes:
        return await self.reports.topology_body()

    def lease_json(self, lease) -> dict:  # noqa: ANN001 - Lease
        return self.reports.lease_json(lease)

    def lease_text(self, lease) -> str | None:  # noqa: ANN001 - Lease
        return self.reports.lease_text(lease)

    def degraded(self) -> list[str]:
        return self.reports.degraded()

    def health(self) -> dict:
        return self.reports.health()

    async def irq_report(self) -> dict:
        return await self.reports.irq_report()

    def links_report(self) -> dict:
        return self.reports.links_report()

    def telemetry(self, body: Any, caller: Any = None) -> dict:
        return self.reports.telemetry(body, caller)

    def metrics_text(self) -> str:
        return self.reports.metrics_text()

    def status_line(self) -> str:
        return self.reports.status_line()

    def setting_up(self, name: str) -> bool:
        """The config wants loop `name` and its setup has not finished (the API answers
        from the moment the socket is bound; a loop's setup may take a moment or retry)."""
        task = self._loops.get(name)
        return task is not None and not task.done()

    # -- configuration ----------------------------------------------------------
    def _reserved_cpus(self) -> set[int]:
        """Never leased: [alloc] reserved_cpus, [irq] housekeeping_cpus, and the first
        reserved_cpus_per_node CPUs of each node with their hyper-thread siblings (so a
        reserved core is never half leased), and each node's housekeeping cores."""
        from topod.alloc.housekeeping import housekeeping_cpus

        reserved = set(cpus(self.config, "alloc", "reserved_cpus")) | set(cpus(self.config, "irq", "housekeeping_cpus"))
        reserved |= housekeeping_cpus(self.state.topology, int(self.config.get("alloc", "housekeeping_cores_per_node")))
        per_node = int(self.config.get("alloc", "reserved_cpus_per_node"))
        if per_node:
            topology = self.state.topology
            for node in topology.numa_nodes:
                for cpu_id in sorted(node.cpus)[:per_node]:
                    cpu = topology.cpu(cpu_id)
                    reserved.add(cpu_id)
                    reserved.update(cpu.siblings if cpu is not None else ())
        return reserved

    async def reload(self) -> dict:
        """SIGHUP or POST /v1/reload: re-read the config and apply all of it, or none of
        it. The file goes through the one schema (every key, range, enum, policy, backend
        and group), so a file the daemon would fail on later is refused now and the running
        config stays whole. Keys read only at start (config.RESTART_KEYS: root, socket,
        state_dir, ...) keep their running value and are named in the verdict and the log.
        The host is rediscovered too (`systemctl reload topod` after a driver change).
        Returns the verdict: {"applied", "reason" (refused), "restart_required" (keys)}.
        Users' cached group memberships are forgotten whatever the verdict: a reload is how
        an administrator makes a change to the group take effect at once."""
        async with self._reload_lock:
            GROUPS.clear()
            self.notifier.reloading()
            try:
                return await self._reload()
            finally:
                self.notifier.ready()
                self.notifier.status(self.status_line())

    async def _reload(self) -> dict:
        path = self.config_path or "(built-in defaults)"
        try:
            new = await asyncio.to_thread(load_config, self.config_path)
        except ConfigError as exc:
            self.config_error = str(exc)
            self.bus.publish("config_rejected", path=path, reason=str(exc))
            return {"applied": False, "path": path, "reason": str(exc), "restart_required": []}
        restart = self.config.restart_changes(new)
        if restart:
            self.bus.publish("config_restart_required", path=path, keys=",".join(restart),
                             reason="read only at start: the running values are kept until topod restarts")
        old, self.config = self.config, new.keeping(self.config)
        self.config_error = None
        self.allowed_group = await asyncio.to_thread(group_id, self.config.get("daemon", "group"))
        self.alloc.configure(self.config.section("alloc"), self._reserved_cpus())
        self._reconcile_loops(old)
        self.alloc.process_queue()  # fewer reserved CPUs may let a waiter in
        self.request_rescan()
        self.bus.publish("config_reloaded", path=path, restart_required=",".join(restart) or None)
        return {"applied": True, "path": path, "reason": None, "restart_required": restart}

    async def _reload_safely(self) -> dict:
        try:
            return await self.reload()
        except Exception as exc:  # noqa: BLE001 - a reload must never take the daemon down
            self.config_error = f"reload failed: {type(exc).__name__}: {exc}"
            log.exception("reload_failed", error=self.config_error)
            self.notifier.ready()
            self.notifier.status(self.status_line())
            return {"applied": False, "path": self.config_path, "reason": self.config_error, "restart_required": []}

    async def reload_config(self) -> dict:
        """The API's reload (root only, checked by the route): the verdict SIGHUP logs."""
        return await self._reload_safely()

    # -- events -------------------------------------------------------------------
    def _log_event(self, record: dict) -> None:
        # A field named as one the log adds itself (lease_granted's `level`, the decision's)
        # is logged as event_<name>: the log's own would overwrite it.
        fields = {(f"event_{k}" if k in LOG_OWN_FIELDS else k): v for k, v in record.items()
                  if k not in ("event", "time")}
        getattr(log, EVENT_LEVELS.get(record["event"], "info"))(record["event"], **fields)

    def _on_event(self, record: dict) -> None:
        if record["event"] in LEASE_EVENTS or record["event"] == "request_queued":
            self._reap_due.set()
        if record["event"] in LEASE_EVENTS:
            self._isolate_due.set()
            if self.irq is not None:
                self.irq.leases_changed()
            if self.probe is not None:
                self.probe.leases_changed()
        # A revoked lease (by root, or a preemption's grace over) takes its job with it, and
        # so does any lease whose scope topod made: the scope is stopped
        # (topod.service.lease_scope); without systemd, said once.
        lease_id = str(record.get("lease"))
        ended = record["event"] == "lease_revoked" or (record["event"] == "lease_released" and
                                                       lease_id in self.scopes.placed)
        if ended and self._tasks is not None and self.scopes.reachable is not False:
            self.scopes.placed.discard(lease_id)
            self._tasks.create_task(self.scopes.stop(lease_id, str(record.get("reason"))), name="topod-scope-stop")

    def _state_changed(self, kind: str) -> None:
        if kind == "hardware":
            new = {gpu.address for gpu in self.state.topology.gpus}
            self.bus.publish("topology_changed", gpus_added=sorted(new - self._gpu_addresses),
                             gpus_removed=sorted(self._gpu_addresses - new),
                             devices=len(self.state.topology.pci_devices))
            self._gpu_addresses = new
            self.alloc.configure(self.config.section("alloc"), self._reserved_cpus())
            if self.irq is not None:
                self.irq.hardware_changed()
            if self.probe is not None:
                self.probe.hardware_changed()
            self._warm_up_soon("hardware changed")
        elif kind == "calibration" and self.irq is not None:
            self.irq.hardware_changed()  # a device's node moved: its IRQs' candidates did too
        if kind in ("hardware", "calibration"):
            self._exports_due.set()

    def _warm_up_soon(self, reason: str) -> None:
        """The engine's per-size references for the new topology, computed in a worker
        thread (LeaseService.warm_up) by a task the daemon's task group owns; before run
        has one, run warms up itself."""
        if self._tasks is not None:
            self._tasks.create_task(self._warm_up(reason), name="topod-warm-up")

    async def _warm_up(self, reason: str) -> None:
        try:
            if not await self.alloc.warm_up():
                return  # a newer change warms up (and freezes) after this one
        except Exception as exc:  # noqa: BLE001 - a decision computes its own view; the daemon goes on
            log.error("warm_up_failed", reason=reason, error=repr(exc))
        try:
            freeze_long_lived(reason)
        except Exception as exc:  # noqa: BLE001 - an unfrozen heap costs collection time, never the daemon
            log.error("heap_freeze_failed", reason=reason, error=repr(exc))

    # -- running ------------------------------------------------------------------
    async def run(self, listen: socket.socket | None = None) -> None:
        from topod.service.server import serve

        # Worker threads parse /proc and /sys in pure Python; with the default 5 ms GIL
        # switch interval a request could wait that long behind them for every step.
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        reclaimed = self.alloc.recover()
        await self.isolate.restore("crash")  # what a crash left narrowed is given back
        runner = await serve(self, self.config, listen)
        self.api_address = next((a for a in runner.addresses if isinstance(a, str) and a), None)
        metrics_runner = None
        if self.config.get("export", "metrics_tcp"):
            from topod.service.server import serve_metrics_tcp

            metrics_runner = await serve_metrics_tcp(self, self.config.get("export", "metrics_tcp"))
        log.info("daemon_started", version=__version__, root=str(self.host.root), leases=len(self.alloc.leases()),
                 reclaimed=reclaimed, gpus=len(self.state.topology.gpus), warnings=len(self.state.topology.warnings))
        log.info("host_access", summary=self.access_summary(), enforcement=self.enforcement.mode,
                 enforcement_reason=self.enforcement.reason)
        try:
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                loop.add_signal_handler(signal.SIGHUP, lambda: tasks.create_task(self._reload_safely()))
                self._reconcile_loops(None)
                # the engine's references in a worker thread: READY=1 and requests meanwhile
                self._warm_up_soon("start")
                tasks.create_task(self._watchdog())
                self.notifier.ready()
                self.notifier.status(self.status_line())
                await self._stop.wait()
                self.notifier.stopping()
                for task in self._loops.values():
                    task.cancel()
                raise _Shutdown
        except* _Shutdown:
            pass
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            await runner.cleanup()
            if metrics_runner is not None:
                await metrics_runner.cleanup()
            self.alloc.owner_watch.close()
            if self.hotplug is not None:
                self.hotplug.close()
            if self.probe is not None:
                self.probe.close()
            await self.isolate.restore("stop")
            await asyncio.to_thread(self.store.close)
            if self.state_lock is not None:
                self.state_lock.close()
            self.bus.drain()  # the log lines of the last events, before the one that ends it
            log.info("daemon_stopped")

    def access_summary(self) -> str:
        """One line: what this daemon will and will not touch on its root."""
        section = self.irq_section()
        irq = {"continuous": f"writes {self.host.root}/proc/irq affinity",
               "dry-run": "plans IRQ affinity but writes nothing", "off": "leaves IRQs alone"}[section["mode"]]
        if self.irq_withheld:
            irq += f" ({self.irq_withheld})"
        probing = self.config.section("probe")
        probe = "probes links" if probing["enabled"] and probes_this_root(self.host, probing) else "no link probes"
        return (f"root {self.host.root} ({'live host' if self.host.is_live else 'captured tree'}): {irq}; {probe}; "
                f"leases in {self.store.path}; API on {self.api_address}")

    @property
    def irq_withheld(self) -> str | None:
        """Why IRQ writes are withheld (in a container, without allow_in_container), or None."""
        return irq_writes_withheld(self.config.section("irq"), self.container)

    def irq_section(self) -> dict:
        """[irq] as the balancer gets it: withheld writes make continuous act as dry-run."""
        section = self.config.section("irq")
        if self.irq_withheld:
            section["mode"] = "dry-run"
        return section

    def _gpu_numbers(self, lease) -> tuple[int | str, ...]:
        """N of each leased GPU's /dev/nvidiaN in the current topology (the index when gone);
        an AMD GPU's render node path instead (topod.scope.device_allow takes both)."""
        gpus = {gpu.index: gpu for gpu in self.state.topology.gpus}
        return tuple((gpus[i].device_files[0] if gpus[i].amd is not None else gpus[i].device_number)
                     if i in gpus else i for i in lease.gpus)

    def stop(self) -> None:
        self._stop.set()

    def request_rescan(self) -> None:
        self._rescan_now.set()

    # -- the loops: which run (the config decides; a reload restarts those whose settings
    # changed), each supervised (a failing iteration, or a failing setup, is logged once,
    # retried with backoff and shown in health and STATUS=, never fatal), and what each
    # does per iteration: reaping leases, node load, exports, rescans, keeping leased cores
    # free, scopes, IRQ balancing, link probing, the API's own liveness, the watchdog.
    def _reconcile_loops(self, old: Config | None) -> None:
        """Start the loops the config asks for, stop the ones it no longer does, restart
        those whose settings changed (a reload applies everything)."""
        def changed(*sections: str) -> bool:
            return old is None or any(old.section(s) != self.config.section(s) for s in sections)

        # A changed [irq] reaches the running balancer in place (IrqTask.configure), so what
        # it learned from the kernel stays: managed IRQs (EIO, announced once), cooldowns,
        # backoffs. Only a new interval restarts the loop (its supervision deadline is its own).
        irq_interval = old is None or old.get("irq", "interval_seconds") != self.config.get("irq", "interval_seconds")
        wanted = {
            "reaper": (True, False),
            "load": (True, False),
            "exports": (True, changed("export")),
            "api": (self.api_address is not None, False),
            "rescan": (True, changed("udev") or old.get("daemon", "rescan_interval_seconds")
                       != self.config.get("daemon", "rescan_interval_seconds")),
            "irq": (self.config.get("irq", "mode") != "off", irq_interval),
            "probe": (bool(self.config.get("probe", "enabled")), changed("probe")),
            "isolate": (self.isolate.wanted, changed("isolate")),
            "scopes": (True, False),
        }
        for name, (want, restart) in wanted.items():
            running = name in self._loops and not self._loops[name].done()
            if running and (not want or restart):
                self._stop_loop(name)
                running = False
            if want and not running:
                self._start_loop(name)
            elif name == "irq" and running and changed("irq") and self.irq is not None:
                self._tasks.create_task(self._configure_irq(self.irq), name="topod-irq-configure")

    async def _configure_irq(self, task) -> None:  # noqa: ANN001 - IrqTask, imported lazily
        try:
            await task.configure(self.irq_section())
        except Exception as exc:  # noqa: BLE001 - in the task group: said, then a fresh loop, never fatal
            self._loop_failed("irq", f"reconfigure: {type(exc).__name__}: {exc}"[:500], "")
            if self.irq is task:
                self._stop_loop("irq")
                self._start_loop("irq")

    def _start_loop(self, name: str) -> None:
        factories = {"reaper": self._reaper_loop, "load": self._load_loop, "exports": self._exports_loop,
                     "api": self._liveness_loop, "rescan": self._rescan_loop, "irq": self._irq_loop,
                     "probe": self._probe_loop, "isolate": self._isolate_loop,
                     "scopes": self._scopes_loop}
        assert self._tasks is not None
        self._loops[name] = self._tasks.create_task(self._guarded(name, factories[name]), name=f"topod-{name}")

    async def _guarded(self, name: str, factory) -> None:  # noqa: ANN001
        """A loop's setup (opening a backend, udev, the balancer) is supervised like its
        iterations: a failure is reported and retried with backoff, never fatal."""
        backoff = Backoff()
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - see the docstring
                error = f"{type(exc).__name__}: {exc}"[:500]
                if self.supervisor.fail(name, error):
                    self._loop_failed(name, f"setup: {error}", "")
                await asyncio.sleep(backoff.delay(self.supervisor.streak(name)))

    def _stop_loop(self, name: str) -> None:
        task = self._loops.pop(name, None)
        if task is not None:
            task.cancel()
        if name == "irq":
            self.irq = None
        elif name == "probe" and self.probe is not None:
            self.probe.close()
            self.probe = None
        elif name == "rescan" and self.hotplug is not None:
            self.hotplug.close()
            self.hotplug = None

    def _loop_failed(self, name: str, error: str, where: str) -> None:
        self.bus.publish("loop_failed", loop=name, error=error, where=where)

    async def _supervised(self, name: str, iteration, deadline: float, **options) -> None:  # noqa: ANN001
        await supervise(self.supervisor, name, iteration, deadline=deadline, report=self._loop_failed, **options)

    def _deadline(self, period: float) -> float:
        return max(period * 3 + 30.0, float(self.config.get("watchdog", "loop_deadline_seconds")))

    async def _reaper_loop(self) -> None:
        async def iteration() -> float | None:
            self._reap_due.clear()
            if self.alloc.reap():
                self.notifier.status(self.status_line())
            if self.alloc.leases() or self.alloc.waiters:
                return REAP_INTERVAL
            try:
                async with asyncio.timeout(REAP_IDLE_SECONDS):
                    await self._reap_due.wait()
            except TimeoutError:
                pass
            return None

        await self._supervised("reaper", iteration, self._deadline(REAP_INTERVAL))

    async def _load_loop(self) -> None:
        async def iteration() -> float:
            load = await asyncio.to_thread(self._load.sample, self.state.topology)
            self.state.set_node_load(load)
            return LOAD_INTERVAL

        await self._supervised("load", iteration, self._deadline(LOAD_INTERVAL))

    async def _exports_loop(self) -> None:
        async def iteration() -> None:
            try:
                # asyncio.timeout, never wait_for: on Python 3.11 wait_for returns the result
                # when a cancel lands as the inner wait completes, and the loop then outlives
                # the stop (the shutdown hung; see tests/unit/test_no_wait_for.py).
                async with asyncio.timeout(EXPORTS_IDLE_SECONDS):
                    await self._exports_due.wait()
            except TimeoutError:
                return  # nothing changed; the beat says the loop is alive
            self._exports_due.clear()
            await asyncio.to_thread(self.nccl.write_host)

        await self._supervised("exports", iteration, self._deadline(EXPORTS_IDLE_SECONDS))

    async def _rescan_loop(self) -> None:
        interval = float(self.config.get("daemon", "rescan_interval_seconds"))
        self.hotplug = await asyncio.to_thread(HotplugSource, self.host, udev_settings(self.config.section("udev")))
        hotplug = self.hotplug

        async def iteration() -> None:
            waits = {asyncio.ensure_future(hotplug.next_change(interval)), asyncio.ensure_future(self._rescan_now.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
            self._rescan_now.clear()
            self.state.set_discovered(await asyncio.to_thread(discover_checked, self.host, self._discovery_memo))

        await self._supervised("rescan", iteration, self._deadline(interval))

    async def _isolate_loop(self) -> None:
        interval = float(self.config.get("isolate", "interval_seconds"))
        self._isolate_due.set()

        async def iteration() -> None:
            polls = self.isolate.polls(bool(self.alloc.leases()))
            try:
                async with asyncio.timeout(interval if polls else ISOLATE_IDLE_SECONDS):
                    await self._isolate_due.wait()
            except TimeoutError:
                if not polls:
                    return  # nothing leased, nothing to give back: the beat says the loop is alive
            self._isolate_due.clear()
            leases = self.alloc.leases()
            leased = frozenset(self.alloc.leased_cpus())
            owners = frozenset(lease.owner_pid for lease in leases if lease.owner_pid)
            await asyncio.to_thread(self.isolate.apply, leased, owners, bool(self.config.get("isolate", "system")))

        await self._supervised("isolate", iteration, self._deadline(interval))

    async def _scopes_loop(self) -> None:
        """Leases end when their scopes do: systemd's signals, read by topod.service.lease_scope."""
        try:
            await self._supervised("scopes", self.scopes.watch, self._deadline(60.0))
        finally:
            await self.scopes.close()

    async def _irq_loop(self) -> None:
        from topod.service.irq_task import IrqTask

        section = self.irq_section()
        interval = float(section["interval_seconds"])
        self.irq = task = IrqTask.from_section(
            self.host, section, topology=lambda: self.state.topology, leased_cpus=self.alloc.leased_cpus,
            publish=self.bus.publish, request_rescan=self.request_rescan)
        try:
            await self._supervised("irq", lambda: task.iteration(interval), self._deadline(interval))
        finally:
            await task.close()

    async def _probe_loop(self) -> None:
        from topod.service.probe_task import ProbeTask

        section = self.config.section("probe")
        self.probe = task = await asyncio.to_thread(ProbeTask, self.host, self.state, section,
                                                    self.alloc.leased_gpus, self.bus.publish)
        await self._supervised("probe", task.iteration,
                               self._deadline(float(section["max_interval_seconds"])))

    async def _liveness_loop(self) -> None:
        """The API's beat comes from the API answering a request through its own socket."""
        async def iteration() -> float:
            async with asyncio.timeout(LIVENESS_TIMEOUT):
                await self._ask_own_socket()
            return LIVENESS_INTERVAL

        await self._supervised("api", iteration, self._deadline(LIVENESS_INTERVAL), beat_on_failure=False)

    async def _ask_own_socket(self) -> None:
        """One GET /v1/health over the daemon's own connection to its API server (made
        once, outside the connection count: a flood of clients, or the descriptor limit,
        cannot fail this check); remade when it breaks."""
        if self._own_connection is None:
            sock = await self.api_site.internal_connection()  # serve() set api_site
            self._own_connection = await asyncio.open_connection(sock=sock)
        reader, writer = self._own_connection
        try:
            writer.write(b"GET /v1/health HTTP/1.1\r\nHost: topod\r\n\r\n")
            await writer.drain()
            status = await reader.readline()
            if not status.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(f"the API answered {status[:40]!r}")
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            await reader.readexactly(length)
        except BaseException:
            self._own_connection = None
            writer.close()
            raise

    def _loops_stalled(self, stalled: list[tuple[str, float, float]]) -> None:
        """Once per stall: which loop, how long, and where it hangs (its task's await
        chain, and the worker threads that are busy), before the watchdog restart."""
        from topod.service.stacks import task_where

        for name, seconds, deadline in stalled:
            self.bus.publish("loop_stalled", loop=name, seconds=round(seconds, 1), deadline_seconds=deadline,
                             where=task_where(self._loops.get(name)))

    async def _watchdog(self) -> None:
        try:
            interval = watchdog_interval()
        except ValueError as exc:
            log.error("watchdog_disabled", reason=str(exc))
            interval = None
        while True:
            try:
                await run_watchdog(self.notifier, self.supervisor, interval, status_text=self.status_line,
                                   on_stalled=self._loops_stalled)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the watchdog itself is supervised too
                log.error("loop_failed", loop="watchdog", error=repr(exc))
                await asyncio.sleep(5.0)


class _Shutdown(Exception):
    pass
