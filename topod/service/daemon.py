"""The daemon: one asyncio loop owns every background task; shutdown cancels them in
order. It wires discovery, the allocation service, the IRQ cycle, probes and the API;
the decisions themselves live in the pure core."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path
from typing import Any

import structlog

from topod import __version__
from topod.service.lease_store import LeaseStore
from topod.service.leases import AllocationService
from topod.api.peer import group_id
from topod.config import Config, cpus, load_config
from topod.discover import discover
from topod.errors import ConfigError, TopodError, UnavailableError
from topod.events import EventBus
from topod.host import HostRoot
from topod.topojson import topology_to_json

log = structlog.get_logger("topod")

REAP_INTERVAL = 1.0


class Daemon:
    def __init__(self, config: Config, *, config_path: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.config_error: str | None = None
        self.host = HostRoot(config.get("daemon", "root"))
        self.bus = EventBus()
        self.bus.add_listener(self._log_event)
        self.started = time.time()
        self.topology = discover(self.host)
        self.discovered = self.topology  # before any measured correction
        self.allowed_group = group_id(config.get("daemon", "group"))
        self.store = LeaseStore(config.get("daemon", "state_dir"))
        self.alloc = AllocationService(self.topology, self.store, self.bus, config.section("alloc"),
                                       self._reserved_cpus(config))
        self.alloc.extra_environment = self._lease_nccl_environment
        self.alloc.on_lease_end = self._remove_lease_files
        self.irq = None
        self.probe = None
        self.loops: dict[str, float] = {}
        self._stop = asyncio.Event()
        self._rescan = asyncio.Event()
        self._wake_irq = asyncio.Event()
        self.bus.add_listener(self._on_event)
        from topod.service.notify import Notifier
        from topod.service.watchdog import Supervisor

        self.notifier = Notifier()
        self.supervisor = Supervisor()

    # -- configuration ----------------------------------------------------------
    def _reserved_cpus(self, config: Config) -> set[int]:
        return set(cpus(config, "alloc", "reserved_cpus")) | set(cpus(config, "irq", "housekeeping_cpus"))

    def reload(self) -> bool:
        """SIGHUP: re-read the config; an invalid one keeps the running config."""
        self.notifier.reloading()
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            self.config_error = str(exc)
            log.error("config_rejected", path=self.config_path, reason=str(exc))
            self.notifier.ready()
            self.notifier.status(f"config rejected, running previous: {exc}")
            return False
        # Socket, state dir and root stay what the process started with.
        keep = {key: self.config.get("daemon", key) for key in ("socket", "state_dir", "root")}
        self.config = new.with_overrides(**keep)
        self.config_error = None
        self.alloc.settings = self.config.section("alloc")
        self.alloc.reserved_cpus = self._reserved_cpus(self.config)
        self.allowed_group = group_id(self.config.get("daemon", "group"))
        if self.irq is not None:
            self.irq.configure(self.config)
        log.info("config_reloaded", path=self.config_path)
        self._wake_irq.set()
        self.notifier.ready()
        self.notifier.status(self.status_line())
        return True

    # -- the Backend the API calls ------------------------------------------------
    def topology_json(self) -> dict:
        doc = topology_to_json(self.topology, self.alloc.distances)
        doc["cluster"] = dict(self.config.section("cluster"))
        doc["leased_gpus"] = sorted(self.alloc.leased_gpus())
        return doc

    def lease_json(self, lease) -> dict:
        body = lease.to_json()
        body["environment"] = lease.decision.get("environment", {})
        return body

    def health(self) -> dict:
        now = time.monotonic()
        return {
            "status": "ok" if self.supervisor.healthy(now) else "degraded",
            "version": __version__,
            "uptime_seconds": round(time.time() - self.started, 3),
            "leases": len(self.alloc.leases()),
            "waiting": len(self.alloc.waiters),
            "gpus": len(self.topology.gpus),
            "gpus_free": len(self.topology.gpus) - len(self.alloc.leased_gpus()),
            "config_error": self.config_error,
            "loops": self.supervisor.report(now),
        }

    def irq_report(self) -> dict:
        if self.irq is None:
            return {"mode": "off", "reason": "IRQ balancing not enabled"}
        return self.irq.report()

    def links_report(self) -> dict:
        if self.probe is None:
            return {"enabled": False, "links": []}
        return self.probe.report()

    def telemetry(self, body: Any) -> dict:
        if self.probe is None:
            raise UnavailableError("link probing is disabled ([probe] enabled = false)")
        return self.probe.telemetry(body)

    def metrics_text(self) -> str:
        from topod.service.metrics_feed import render_metrics

        return render_metrics(self)

    def status_line(self) -> str:
        free = len(self.topology.gpus) - len(self.alloc.leased_gpus())
        parts = [f"{len(self.alloc.leases())} lease(s)", f"{free}/{len(self.topology.gpus)} GPU(s) free"]
        if self.alloc.waiters:
            parts.append(f"{len(self.alloc.waiters)} waiting")
        if self.irq is not None:
            parts.append(self.irq.status())
        if self.config_error:
            parts.append(f"config rejected: {self.config_error}")
        return "; ".join(parts)

    # -- events -------------------------------------------------------------------
    def _log_event(self, record: dict) -> None:
        fields = {k: v for k, v in record.items() if k not in ("event", "time")}
        log.info(record["event"], **fields)

    def _on_event(self, record: dict) -> None:
        if record["event"] in ("lease_granted", "lease_released", "lease_revoked"):
            self._wake_irq.set()
            if self.probe is not None:
                self.probe.leases_changed()

    # -- running ------------------------------------------------------------------
    async def run(self, listen: socket.socket | None = None) -> None:
        from topod.service.server import serve

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        recovered = self.alloc.recover()
        log.info("daemon_started", version=__version__, root=str(self.host.root), leases=len(self.alloc.leases()),
                 reclaimed=recovered, gpus=len(self.topology.gpus), warnings=len(self.topology.warnings))
        self._start_optional_subsystems()
        runner = await serve(self, self.config, listen)
        metrics_runner = None
        if self.config.get("export", "metrics_tcp"):
            from topod.service.server import serve_metrics_tcp

            metrics_runner = await serve_metrics_tcp(self, self.config.get("export", "metrics_tcp"))
        self.write_nccl_topology()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._loop("reaper", REAP_INTERVAL, self._reap_once))
                tasks.create_task(self._rescan_loop())
                if self.irq is not None:
                    tasks.create_task(self._irq_loop())
                if self.probe is not None:
                    tasks.create_task(self._probe_loop())
                tasks.create_task(self._watchdog_loop())
                self.notifier.ready()
                self.notifier.status(self.status_line())
                await self._stop.wait()
                self.notifier.stopping()
                raise _Shutdown
        except* _Shutdown:
            pass
        finally:
            await runner.cleanup()
            if metrics_runner is not None:
                await metrics_runner.cleanup()
            self.alloc.owner_watch.close()
            self.store.close()
            log.info("daemon_stopped")

    def write_nccl_topology(self) -> None:
        """[export] write_nccl_topology: the host's NCCL topology file, with corrected locality."""
        if not self.config.get("export", "write_nccl_topology") or not self.topology.gpus:
            return
        from topod.export.nccl import build_nccl_xml, read_nccl_host_facts, render_nccl_xml, write_nccl_topology

        path = self.config.get("export", "nccl_topology_file")
        try:
            facts = read_nccl_host_facts(self.host, self.topology)
            xml = build_nccl_xml(self.topology, cpu_identity=facts.cpu_identity, net_names=facts.net_names,
                                 subsystem_ids=facts.subsystem_ids, gdr=facts.gdr)
            write_nccl_topology(render_nccl_xml(xml), path=path)
        except (OSError, TopodError, ValueError) as exc:
            log.warning("nccl_topology_not_written", path=path, reason=str(exc))
            return
        log.info("nccl_topology_written", path=path)

    def _lease_nccl_path(self, lease_id: str) -> Path:
        return Path(self.config.get("daemon", "state_dir")) / "nccl" / f"{lease_id}.xml"

    def _lease_nccl_environment(self, lease) -> dict[str, str]:
        """With write_nccl_topology: a per-lease NCCL topology (its GPUs and CPUs only)."""
        if not self.config.get("export", "write_nccl_topology") or not lease.gpus:
            return {}
        from topod.export.nccl import build_nccl_xml, read_nccl_host_facts, render_nccl_xml, write_nccl_topology

        path = self._lease_nccl_path(lease.id)
        try:
            facts = read_nccl_host_facts(self.host, self.topology)
            xml = build_nccl_xml(self.topology, gpus=list(lease.gpus), cpus=list(lease.cpus) or None,
                                 cpu_identity=facts.cpu_identity, net_names=facts.net_names,
                                 subsystem_ids=facts.subsystem_ids, gdr=facts.gdr)
            write_nccl_topology(render_nccl_xml(xml), path=str(path))
        except (OSError, TopodError, ValueError) as exc:
            log.warning("nccl_topology_not_written", lease=lease.id, reason=str(exc))
            return {}
        return {"NCCL_TOPO_FILE": str(path)}

    def _remove_lease_files(self, lease) -> None:
        try:
            self._lease_nccl_path(lease.id).unlink()
        except FileNotFoundError:
            pass

    def stop(self) -> None:
        self._stop.set()

    def _start_optional_subsystems(self) -> None:
        mode = self.config.get("irq", "mode")
        if mode != "off":
            from topod.service.irq_task import IrqTask

            self.irq = IrqTask(self)
        if self.config.get("probe", "enabled"):
            from topod.service.probe_task import ProbeTask

            self.probe = ProbeTask(self)

    async def _loop(self, name: str, interval: float, step) -> None:
        self.supervisor.register(name, max(interval * 5, float(self.config.get("watchdog", "loop_deadline_seconds"))))
        while True:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - a failing step must not kill the daemon
                # No beat: if it keeps failing, the watchdog sees a stalled loop.
                log.error("loop_step_failed", loop=name, error=repr(exc))
            else:
                self.supervisor.beat(name)
            await asyncio.sleep(interval)

    def _reap_once(self) -> None:
        if self.alloc.reap():
            self.notifier.status(self.status_line())

    async def _rescan_loop(self) -> None:
        from topod.service.hotplug import HotplugSource

        name = "rescan"
        interval = float(self.config.get("daemon", "rescan_interval_seconds"))
        self.supervisor.register(name, interval * 2 + 60)
        source = HotplugSource(self.host)
        source.start(self._rescan.set)
        try:
            while True:
                try:
                    await asyncio.wait_for(self._rescan.wait(), timeout=interval)
                except TimeoutError:
                    pass
                self._rescan.clear()
                self.rediscover()
                self.supervisor.beat(name)
        finally:
            source.stop()

    def rediscover(self) -> bool:
        new = discover(self.host)
        if new == self.discovered:
            return False
        self.discovered = new
        old_gpus = {g.address for g in self.topology.gpus}
        new_gpus = {g.address for g in new.gpus}
        self.topology = new
        self.alloc.set_topology(new)
        self.bus.publish("topology_changed", gpus_added=sorted(new_gpus - old_gpus),
                         gpus_removed=sorted(old_gpus - new_gpus), devices=len(new.pci_devices))
        self._wake_irq.set()
        if self.probe is not None:
            self.probe.topology_changed()
        self.write_nccl_topology()
        self.alloc.process_queue()
        return True

    async def _irq_loop(self) -> None:
        name = "irq"
        interval = float(self.config.get("irq", "interval_seconds"))
        self.supervisor.register(name, interval * 3 + 30)
        while True:
            self.irq.cycle()
            self.supervisor.beat(name)
            self._wake_irq.clear()
            try:
                await asyncio.wait_for(self._wake_irq.wait(), timeout=interval)
            except TimeoutError:
                pass

    async def _probe_loop(self) -> None:
        name = "probe"
        self.supervisor.register(name, float(self.config.get("probe", "max_interval_seconds")) * 2 + 120)
        while True:
            delay = await self.probe.step()
            self.supervisor.beat(name)
            await asyncio.sleep(delay)

    async def _watchdog_loop(self) -> None:
        from topod.service.watchdog import watchdog_interval

        interval = watchdog_interval()
        self.supervisor.register("api", 30.0)
        last_status = ""
        while True:
            self.supervisor.beat("api")  # the loop itself running is the API loop making progress
            now = time.monotonic()
            if self.supervisor.healthy(now):
                if interval is not None:
                    self.notifier.watchdog()
                status = self.status_line()
            else:
                status = f"stalled: {', '.join(self.supervisor.stalled(now))}"
            if status != last_status:
                self.notifier.status(status)
                last_status = status
            await asyncio.sleep(interval if interval is not None else 5.0)


class _Shutdown(Exception):
    pass
