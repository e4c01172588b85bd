"""Leased cores kept free of topod itself, always, and with `[isolate] system` of every
other process too: on cgroup v2 by narrowing the slices (topod.slices: system.slice,
user.slice and init.scope's AllowedCPUs=), elsewhere by each thread's affinity
(topod.isolate). Only on the host topod runs on: a captured tree's CPUs are not this
machine's, so nothing is isolated there and health says why. What was narrowed is
recorded before it is, and given back at the next start after a crash, and at a stop.

The daemon's `isolate` loop calls `apply` in a worker thread when leases change."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from topod.config import Config
from topod.host import HostRoot
from topod.slices import SliceIsolation

log = structlog.get_logger("topod")


class IsolationTask:
    def __init__(self, host: HostRoot, state_dir: str, enforcement: Any, config: Callable[[], Config],
                 online_cpus: Callable[[], Iterable[int]]) -> None:
        """enforcement: topod.enforce's answer for this host (mode, reason); config: the
        daemon's current config (it follows a reload); online_cpus: the current topology's."""
        self.host = host
        self.enforcement = enforcement
        self._config = config
        self._online_cpus = online_cpus
        self.affinity = None  # topod.isolate.Isolation where threads can be narrowed here
        self.kept_off: frozenset[int] | None = None  # the CPUs topod itself keeps off
        self.own_cpus: frozenset[int] = frozenset()
        if enforcement.mode != "none":
            from topod.isolate import Isolation

            self.own_cpus = frozenset(os.sched_getaffinity(0))
            self.affinity = Isolation(host, state_dir)
        self.slices = SliceIsolation(state_dir)  # cgroup v2: its own record

    @property
    def wanted(self) -> bool:
        """Whether the daemon runs the isolate loop at all."""
        return self.affinity is not None or self.method() == "cgroup"

    def polls(self, leased: bool) -> bool:
        """Whether the loop must look again every interval: while CPUs are leased (new
        processes to keep off them) or while threads or slices it narrowed are recorded (to
        give back). Otherwise only a lease change or a reload brings it anything to do."""
        return leased or bool(self.slices.record) or (self.affinity is not None and bool(self.affinity.record))

    def method(self) -> str | None:
        """cgroup (the slices) or affinity (the threads); None: nothing can be isolated here."""
        method = self._config().get("isolate", "method")
        if method == "auto":
            return "cgroup" if self.enforcement.mode == "cgroup" else "affinity" if self.affinity is not None else None
        return method if method == "cgroup" or self.affinity is not None else None

    def apply(self, leased: frozenset[int], owners: frozenset[int], system: bool) -> None:
        """In a worker thread: topod off leased CPUs; with [isolate] system, everyone else too
        (cgroup: the slices' AllowedCPUs=; affinity: each thread's)."""
        from topod.isolate import keep_off

        if self.affinity is not None and self.kept_off != leased:
            keep_off(self.host, leased, self.own_cpus)
            self.kept_off = leased
        cgroup = system and self.method() == "cgroup"
        housekeeping = tuple(c for c in self._online_cpus() if c not in leased) if cgroup and leased else ()
        if housekeeping or self.slices.record:
            result = self.slices.apply(housekeeping)
            if result["narrowed_now"] or result["restored_now"] or result["left_alone"] or result["failed"]:
                log.info("isolation_applied" if housekeeping else "isolation_restored", method="cgroup", **result)
        if self.affinity is None:
            return
        if system and not cgroup:
            before = self.affinity.last.get("threads_narrowed", 0)
            result = self.affinity.apply(leased, owners)
            if result.get("narrowed_now") or result.get("restored_now") or before != result["threads_narrowed"]:
                log.info("isolation_applied", **result)
        elif self.affinity.record:
            log.info("isolation_restored", after="isolate.system off", **self.affinity.restore())

    async def restore(self, after: str) -> None:
        """Give back what a record says was narrowed (after a crash, at a stop)."""
        if self.affinity is not None and self.affinity.record:
            log.info("isolation_restored", after=after, **await asyncio.to_thread(self.affinity.restore))
        if self.slices.record:
            try:
                log.info("isolation_restored", after=after, method="cgroup",
                         **await asyncio.to_thread(self.slices.restore))
            except Exception as exc:  # noqa: BLE001 - kept in the record: tried again at the next start
                log.error("isolation_not_restored", after=after, method="cgroup", error=str(exc),
                          record=self.slices.path)

    def health(self) -> dict:
        system = bool(self._config().get("isolate", "system"))
        if self.method() == "cgroup":
            effective = self.enforcement.mode == "cgroup"
            return {"system": system, "method": "cgroup", "effective": effective, "reason": None if effective else
                    f"AllowedCPUs= is recorded on the slices but has no effect here: {self.enforcement.reason}",
                    **self.slices.last}
        if self.affinity is None:
            return {"system": system, "active": False, "reason": f"enforcement none: {self.enforcement.reason}"}
        return {"system": system, "method": "affinity",
                "topod_cpus": None if self.kept_off is None else sorted(self.own_cpus - self.kept_off or self.own_cpus),
                **self.affinity.last}
