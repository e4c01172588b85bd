"""The daemon's loops: which run (the config decides; a reload restarts those whose
settings changed), each supervised (a failing iteration, or a failing setup, is logged
once, retried with backoff and shown in health and STATUS=, never fatal), and what each
does per iteration: reaping leases, node load, exports, rescans, keeping leased cores
free, scopes, IRQ balancing, link probing, the API's own liveness, the watchdog.

A mixin of topod.service.daemon.Daemon: the loops read the daemon's state (its config,
lease service, host state, bus, notifier) and nothing else holds them.
"""

from __future__ import annotations

import asyncio

import structlog

from topod.config import Config
from topod.service.hotplug import HotplugSource, discover_checked, udev_settings
from topod.service.supervise import Backoff, supervise
from topod.service.watchdog import run_watchdog, watchdog_interval

log = structlog.get_logger("topod")

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


class DaemonLoops:
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
