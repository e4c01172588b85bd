"""Group commit: changes made together (in one turn of the loop) share one commit, one
fsync, and each is acknowledged only after it; every commit is the writer thread's, never
the event loop's, however fast or slow the disk; changes land in the order they were made,
and a loop closed mid-turn stalls no later loop's changes."""

from __future__ import annotations

import asyncio
import random
import threading
import time

from tests.service.lease_store_helpers import _watch_transactions, _writer_idle, make_lease
from topod.service.lease_store import LeaseStore


def test_concurrent_changes_share_one_commit_and_each_waits_for_it(tmp_path):
    store = LeaseStore(tmp_path)

    async def scenario():
        commits = [store.add(make_lease(f"l{g}", (g,))) for g in range(8)]
        assert all(not c.done() for c in commits), "a change is not acknowledged before its commit"
        await asyncio.gather(*commits)

    asyncio.run(scenario())
    assert store.changes == 8 and store.commits < 8, (store.commits, store.changes)
    store.close()
    reopened = LeaseStore(tmp_path)
    assert sorted(lease.id for lease in reopened.all()) == [f"l{g}" for g in range(8)]
    reopened.close()


def test_changes_made_in_one_turn_of_the_loop_share_one_commit(tmp_path):
    """The idle writer is woken when the loop's turn is over, not by the first change of
    it: the requests that arrived together are one commit (one fsync), every time."""
    store = LeaseStore(tmp_path)

    async def scenario():
        await store.add(make_lease("first", (7,)))  # the writer thread runs and goes idle
        for round_ in range(3):
            before = store.commits
            commits = [store.add(make_lease(f"r{round_}g{g}", (g,))) for g in range(7)]
            await asyncio.gather(*commits)
            assert store.commits == before + 1, (round_, store.commits - before)
            ended = [store.remove(f"r{round_}g{g}")[1] for g in range(7)]
            await asyncio.gather(*ended)

    asyncio.run(scenario())
    store.close()


def test_no_commit_ever_runs_on_the_event_loop_however_fast_the_disk(tmp_path):
    """Lone changes on an idle writer and a fast disk (where a hand-off to the thread costs
    most): every transaction is still the writer thread's, never the loop's."""
    store = LeaseStore(tmp_path)
    writers = _watch_transactions(store)

    async def scenario() -> int:
        for g in range(6):
            await _writer_idle(store) if g else None
            commit = store.add(make_lease(f"l{g}", (g,)))
            assert not commit.done(), "not acknowledged before its commit"
            await commit
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert len(writers) == 6 and loop_thread not in writers, writers
    store.close()
    reopened = LeaseStore(tmp_path)
    assert sorted(lease.id for lease in reopened.all()) == [f"l{g}" for g in range(6)]
    reopened.close()


def test_a_disk_that_stalls_after_fast_commits_never_holds_the_loop(tmp_path):
    """Fast commits, then one that takes 0.6 s (a frozen filesystem): the loop keeps
    ticking throughout, and the store says the write is stalled while it lasts."""
    import topod.service.lease_writer as lease_writer

    store = LeaseStore(tmp_path)
    slow = {"seconds": 0.0}
    _watch_transactions(store, lambda: slow["seconds"])

    async def scenario() -> tuple[list[float], list[str | None]]:
        for g in range(5):
            await store.add(make_lease(f"fast{g}", (g,)))
            await _writer_idle(store)
        slow["seconds"] = 0.6
        ticks: list[float] = []
        problems: list[str | None] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                problems.append(store.problem())
                await asyncio.sleep(0.002)

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        original, lease_writer.STALLED_WRITE_SECONDS = lease_writer.STALLED_WRITE_SECONDS, 0.2
        try:
            await store.add(make_lease("stalled", (5,)))
        finally:
            lease_writer.STALLED_WRITE_SECONDS = original
        ticking.cancel()
        return ticks, problems

    ticks, problems = asyncio.run(scenario())
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) >= 50 and max(gaps) < 0.1, (len(ticks), max(gaps))
    assert any(p and "lease write stalled" in p for p in problems), "the stall was never reported"
    assert store.problem() is None, "reported only while it lasts"
    store.close()


def test_commits_keep_the_order_of_the_changes_on_a_fast_and_slow_disk(tmp_path):
    """Grants and releases of the same GPUs, queued alone or several to a turn, while the
    disk is now fast, now slow: every change lands in the order it was queued (a release
    written before its grant would leave a row the mirror does not have)."""
    rng, disk = random.Random(26), random.Random(62)
    store = LeaseStore(tmp_path)
    spans: list[tuple[float, float]] = []
    writers = _watch_transactions(store, lambda: disk.choice((0.0, 0.0, 0.0, 0.0, 0.004)), spans)

    async def scenario() -> int:
        await store.add(make_lease("warm", (5,)))
        # A batch the thread writes slowly, and a lone change queued meanwhile: it waits
        # for the next transaction (one connection, one transaction at a time).
        disk_before, disk.choice = disk.choice, lambda _: 0.05
        batch = [store.add(make_lease("b6", (6,))), store.add(make_lease("b7", (7,)))]
        await asyncio.sleep(0.01)  # the thread is writing them
        disk.choice = disk_before
        lone = store.add(make_lease("lone", (4,)))
        await asyncio.gather(*batch, lone)
        pending: list[asyncio.Future] = []
        for step in range(400):
            gpu = rng.randrange(4)
            holder = store.holder_of(f"0000:{0x10 + gpu:02x}:00.0")
            if holder is None:
                pending.append(store.add(make_lease(f"s{step}", (gpu,))))
            elif store.get(holder) is not None:  # else its release is in flight already
                pending.append(store.remove(holder)[1])
            end_of_turn = rng.random()
            if pending and end_of_turn < 0.4:  # a lone change, waited for
                await pending.pop()
            elif end_of_turn < 0.6:  # the few changes queued in this turn go together
                await asyncio.sleep(0)
        await asyncio.gather(*pending)
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert loop_thread not in writers
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), "two writes at once"
    mirror = sorted((lease.id, lease.addresses) for lease in store.all())
    store.close()
    reopened = LeaseStore(tmp_path)
    assert sorted((lease.id, lease.addresses) for lease in reopened.all()) == mirror
    reopened.close()


def test_a_loop_closed_before_its_turn_ended_does_not_stall_the_next_loops_changes(tmp_path):
    store = LeaseStore(tmp_path)

    async def first():
        await store.add(make_lease("a", (0,)))
        store.add(make_lease("b", (1,)))  # its wake-up is due when this turn ends: never

    async def second():
        await asyncio.wait_for(store.add(make_lease("c", (2,))), 5)

    asyncio.run(first())
    asyncio.run(second())
    store.flush()
    assert sorted(row[0] for row in store.writer._db.execute("SELECT id FROM leases")) == ["a", "b", "c"]
    store.close()
