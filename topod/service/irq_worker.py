"""The IRQ balancer in its own process. A full cycle parses every /proc/irq/N and
/proc/interrupts in pure Python (hundreds of milliseconds on 4,096 IRQs); in a thread of
the daemon that work would hold the GIL against the event loop, and every API request
would wait behind it. In a child process it costs the API nothing.

The child keeps the balancer (its snapshots, cooldowns and failure state) between calls;
the daemon sends the topology only when it changed and gets back what it shows after each
cycle: events, health, STATUS= text and per-CPU interrupt rates. The full plan (/v1/irqs,
thousands of entries on a big host) is fetched only when asked for: unpickling it after
every cycle would hold the GIL against the loop. A child
that dies is replaced on the next call (the supervised loop reports the failure); where
no process can be started the balancer runs in a thread instead, and says so.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import structlog

from topod.model import Topology

log = structlog.get_logger("topod")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one cycle or re-plan tells the daemon (picklable)."""

    kind: str  # "cycle" | "replan"
    events: tuple[dict[str, Any], ...]
    moves: int
    rediscover: bool
    health: dict[str, Any]
    status: str
    moves_total: int
    cpu_rates: dict[int, float] = field(default_factory=dict)


# -- the child's side (module state is the child process's own) -----------------------
_BALANCER = None
_TOPOLOGY: Topology | None = None


def _start(root: str, section: dict[str, Any]) -> None:
    global _BALANCER  # noqa: PLW0603 - one balancer per worker process, by design
    from topod.host import HostRoot
    from topod.irq.cycle import IrqBalancer
    from topod.irq.settings import IrqSettings

    _BALANCER = IrqBalancer(HostRoot(root), IrqSettings.from_section(section))


def _configure(section: dict[str, Any]) -> None:
    from topod.irq.settings import IrqSettings

    _BALANCER.configure(IrqSettings.from_section(section))


def _run(full: bool, topology: Topology | None, leased: frozenset[int]) -> Outcome:
    global _TOPOLOGY  # noqa: PLW0603
    if topology is not None:
        _TOPOLOGY = topology
    if _TOPOLOGY is None:
        raise RuntimeError("IRQ worker has no topology yet")
    return outcome_of(_BALANCER, _BALANCER.cycle(_TOPOLOGY, leased) if full else _BALANCER.replan(_TOPOLOGY, leased))


def _report() -> dict[str, Any]:
    return _BALANCER.report() if _BALANCER is not None else {}


def outcome_of(balancer, report) -> Outcome:  # noqa: ANN001 - IrqBalancer, CycleReport
    rates: dict[int, float] = {}
    load = balancer.last_load
    if load is not None:
        for per_cpu in load.irq_cpu_rate.values():
            for cpu, rate in per_cpu.items():
                rates[cpu] = rates.get(cpu, 0.0) + rate
    return Outcome(kind=getattr(report, "kind", "cycle"), events=tuple(report.events), moves=report.moves,
                   rediscover=report.rediscover, health=balancer.health(),
                   status=balancer.status_text(), moves_total=balancer.moves_total, cpu_rates=rates)


# -- the daemon's side -----------------------------------------------------------------
class IrqWorker:
    def __init__(self, root: str, section: dict[str, Any]) -> None:
        self.root = root
        self.section = dict(section)
        self._pool: ProcessPoolExecutor | None = None
        self._sent: Topology | None = None
        self._thread_balancer = None  # the fallback when no process can be started
        self.where = "process"

    def _pool_or_start(self) -> ProcessPoolExecutor | None:
        if self._pool is None and self._thread_balancer is None:
            try:
                # spawn: the daemon has threads (lease writer, executor); forking them is unsafe
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_start,
                                                 initargs=(self.root, self.section))
                self._sent = None
            except (OSError, ValueError, NotImplementedError) as exc:
                self._use_thread(f"no worker process ({exc})")
        return self._pool

    def _use_thread(self, why: str) -> None:
        from topod.host import HostRoot
        from topod.irq.cycle import IrqBalancer
        from topod.irq.settings import IrqSettings

        self.where = f"thread: {why}"
        log.warning("irq_worker_in_thread", reason=why)
        self._thread_balancer = IrqBalancer(HostRoot(self.root), IrqSettings.from_section(self.section))

    async def configure(self, section: dict[str, Any]) -> None:
        self.section = dict(section)
        if self._thread_balancer is not None:
            from topod.irq.settings import IrqSettings

            self._thread_balancer.configure(IrqSettings.from_section(section))
        elif self._pool is not None:
            await asyncio.wrap_future(self._pool.submit(_configure, self.section))

    async def run(self, full: bool, topology: Topology, leased: frozenset[int]) -> Outcome:
        pool = self._pool_or_start()
        if pool is None:
            balancer = self._thread_balancer
            step = balancer.cycle if full else balancer.replan
            report = await asyncio.to_thread(step, topology, leased)
            return outcome_of(balancer, report)
        send = None if topology is self._sent else topology
        try:
            outcome = await asyncio.wrap_future(pool.submit(_run, full, send, leased))
        except BrokenProcessPool:
            self._discard_pool()
            raise RuntimeError("the IRQ worker process died; a new one starts on the next cycle") from None
        self._sent = topology
        return outcome

    async def report(self) -> dict[str, Any]:
        if self._thread_balancer is not None:
            return self._thread_balancer.report()
        if self._pool is None:
            return {}
        try:
            return await asyncio.wrap_future(self._pool.submit(_report))
        except BrokenProcessPool:
            self._discard_pool()
            raise RuntimeError("the IRQ worker process died; a new one starts on the next cycle") from None

    def _discard_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        self._sent = None

    def close(self) -> None:
        self._discard_pool()
