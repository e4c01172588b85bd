"""The isolate loop on a host with nothing leased and nothing narrowed waits for a lease
change instead of a worker-thread round every [isolate] interval (issue 26: idle CPU);
while CPUs are leased, or a record of narrowed threads is kept, it looks every interval."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from topod.service import daemon
from topod.service.daemon import Daemon
from topod.service.isolation_task import IsolationTask


class Loops(Daemon):
    """The daemon's isolate loop alone, its iterations run back to back (no supervisor)."""

    def __init__(self, leases: list, recorded: bool = False) -> None:
        self.config = SimpleNamespace(get=lambda section, key: {"interval_seconds": 0.01, "system": False, "loop_deadline_seconds": 60.0}[key])
        self.alloc = SimpleNamespace(leases=lambda: leases, leased_cpus=lambda: [0] if leases else [])
        self.applied = []
        record = {1: "narrowed"} if recorded else {}
        self.isolate = SimpleNamespace(
            polls=lambda leased: IsolationTask.polls(
                SimpleNamespace(slices=SimpleNamespace(record={}), affinity=SimpleNamespace(record=record)), leased),
            apply=lambda leased, owners, system: self.applied.append(leased))
        self._isolate_due = asyncio.Event()

    async def _supervised(self, name, iteration, deadline, **options):  # noqa: ANN001
        while True:
            await iteration()


async def _applied_within(loops: Loops, seconds: float, poke_after: float | None = None) -> int:
    task = asyncio.ensure_future(loops._isolate_loop())
    if poke_after is not None:
        await asyncio.sleep(poke_after)
        loops._isolate_due.set()  # a lease change
    await asyncio.sleep(seconds - (poke_after or 0))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return len(loops.applied)


def test_with_nothing_leased_it_applies_once_then_waits(monkeypatch):
    monkeypatch.setattr(daemon, "ISOLATE_IDLE_SECONDS", 0.05)
    assert asyncio.run(_applied_within(Loops([]), 0.3)) == 1  # at start; idle beats do nothing


def test_a_lease_change_wakes_it(monkeypatch):
    monkeypatch.setattr(daemon, "ISOLATE_IDLE_SECONDS", 60.0)
    assert asyncio.run(_applied_within(Loops([]), 0.6, poke_after=0.3)) == 2


@pytest.mark.parametrize("leases, recorded", [([SimpleNamespace(owner_pid=None)], False), ([], True)])
def test_while_cpus_are_leased_or_narrowed_threads_are_recorded_it_looks_every_interval(monkeypatch, leases, recorded):
    monkeypatch.setattr(daemon, "ISOLATE_IDLE_SECONDS", 60.0)
    assert asyncio.run(_applied_within(Loops(leases, recorded), 0.3)) >= 5
