"""The IRQ loop inside the daemon: full cycles on the interval and on hardware changes,
coalesced incremental re-plans after lease changes, one at a time, all in the IRQ worker
process (topod.service.irq_worker): the balancer's /proc parsing never holds the GIL
against the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from topod.irq.settings import IrqSettings
from topod.model import Topology
from topod.service.irq_worker import IrqWorker, Outcome

log = structlog.get_logger("topod")
COALESCE_SECONDS = 0.2  # one re-plan per burst of lease changes, this long after the first


class IrqTask:
    def __init__(self, worker: IrqWorker, topology: Callable[[], Topology], leased_cpus: Callable[[], set[int]],
                 publish: Callable[..., None], request_rescan: Callable[[], None]) -> None:
        self.worker = worker
        self.mode = IrqSettings.from_section(worker.section).mode
        self.last: Outcome | None = None
        self._topology = topology
        self._leased_cpus = leased_cpus
        self._publish = publish
        self._request_rescan = request_rescan
        self._lock = asyncio.Lock()
        self._full = asyncio.Event()
        self._full.set()  # the first iteration is a full cycle
        self._replan = asyncio.Event()
        self._next_full: float | None = None

    @classmethod
    def from_section(cls, host, section: dict, **callbacks) -> IrqTask:  # noqa: ANN001 - HostRoot
        IrqSettings.from_section(section)  # refuse a bad section here, not in the worker
        return cls(IrqWorker(str(host.root), section), **callbacks)

    async def close(self) -> None:
        await self.worker.close()

    async def configure(self, section: dict) -> None:
        """A reload's new [irq] (same interval), taken by the running balancer between two
        calls (IrqBalancer.configure keeps its failure marks and cooldowns); a full cycle
        under the new settings follows at once."""
        mode = IrqSettings.from_section(section).mode
        async with self._lock:
            await self.worker.configure(section)
        self.mode = mode
        self._full.set()

    # -- triggers (called on the event loop) -------------------------------------------
    def leases_changed(self) -> None:
        self._replan.set()

    def hardware_changed(self) -> None:
        self._full.set()

    # -- the loop's iteration -------------------------------------------------------
    async def iteration(self, interval: float) -> None:
        """Wait for a trigger or the interval, then run one cycle or re-plan. The interval
        counts from the last full cycle: a steady stream of lease changes (each answered
        by a re-plan) never postpones the full one."""
        now = time.monotonic()
        if self._next_full is not None and now >= self._next_full:
            self._full.set()
        if not self._full.is_set():
            timeout = interval if self._next_full is None else max(0.0, self._next_full - now)
            waits = {asyncio.ensure_future(self._full.wait()), asyncio.ensure_future(self._replan.wait())}
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
            if not self._replan.is_set():
                self._full.set()  # the interval passed (or hardware changed): a full cycle
        if not self._full.is_set():
            await asyncio.sleep(COALESCE_SECONDS)  # let the burst of lease changes finish
        full = self._full.is_set()
        self._full.clear()
        self._replan.clear()
        if full:
            self._next_full = time.monotonic() + interval
        await self.run(full)

    async def run(self, full: bool) -> None:
        topology, leased = self._topology(), frozenset(self._leased_cpus())
        async with self._lock:
            outcome = await self.worker.run(full, topology, leased)
        self.last = outcome
        for event in outcome.events:
            fields = {k: v for k, v in event.items() if k != "event"}
            self._publish(str(event.get("event", "irq_event")), **fields)
        if outcome.rediscover:
            self._request_rescan()

    # -- views (the last outcome; before the first, what is known) ----------------------
    @property
    def moves_total(self) -> int:
        return self.last.moves_total if self.last else 0

    @property
    def cpu_rates(self) -> dict[int, float]:
        return self.last.cpu_rates if self.last else {}

    async def report(self) -> dict:
        if self.last is None:
            return {"mode": self.mode, "cycles": 0, "irqs": [], "note": "the first cycle has not finished yet"}
        async with self._lock:  # one call at a time into the worker
            report = await self.worker.report()
        return {**report, "worker": self.worker.where}

    def health(self) -> dict:
        if self.last is None:
            health = {"mode": self.mode, "cycles": 0, "replans": 0, "moves_total": 0, "unsettable": 0,
                      "writable": None, "last_error": None}
        else:
            health = dict(self.last.health)
        health["worker"] = {"pid": self.worker.pid, "starts": self.worker.starts}
        return health

    def status(self) -> str:
        return self.last.status if self.last else f"IRQ ({self.mode}): first cycle pending"
