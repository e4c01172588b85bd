"""Group commit: changes made together (in one turn of the loop) share one commit, one
fsync, and each is acknowledged only after it; a lone change is committed by the loop
itself while commits are fast, by the writer thread once the disk turns slow; on either,
changes land in the order they were made, and a loop closed mid-turn stalls no later
loop's changes."""

from __future__ import annotations

import asyncio
import random
import threading
import time

from tests.service.lease_store_helpers import _fast_disks, _watch_transactions, _writer_idle, make_lease
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


def test_a_lone_change_is_committed_by_the_loop_when_its_turn_ends(tmp_path, monkeypatch):
    """One change waiting, the writer idle, commits known to be fast: the loop commits it
    itself once its turn is over (no hand-off to the thread and back), and the change's
    future still resolves only after its commit."""
    _fast_disks(monkeypatch)
    store = LeaseStore(tmp_path)
    writers = _watch_transactions(store)

    async def scenario() -> int:
        await store.add(make_lease("first", (0,)))  # no commit time known yet: the thread
        assert store.writer.loop_commits == 0
        await _writer_idle(store)
        for g in (1, 2, 3):
            commit = store.add(make_lease(f"l{g}", (g,)))
            assert not commit.done() and store.writer.loop_commits == g - 1, "not before the turn ends"
            await commit
            assert store.writer.loop_commits == g
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert writers[0] != loop_thread and writers[1:] == [loop_thread] * 3, writers
    assert store.commits == 4
    store.close()
    reopened = LeaseStore(tmp_path)
    assert sorted(lease.id for lease in reopened.all()) == ["first", "l1", "l2", "l3"]
    reopened.close()


def test_a_slow_disk_holds_the_loop_for_one_commit_then_the_thread_writes_until_fast_again(tmp_path, monkeypatch):
    _fast_disks(monkeypatch)
    store = LeaseStore(tmp_path)
    slow = {"seconds": 0.0}
    writers = _watch_transactions(store, lambda: slow["seconds"])

    async def scenario() -> int:
        await store.add(make_lease("a", (0,)))  # the thread
        await _writer_idle(store)
        await store.add(make_lease("b", (1,)))  # the loop: commits are fast
        assert store.writer.loop_commits == 1
        slow["seconds"] = 0.3  # the average goes over FAST_ENOUGH: 0.06, then 0.11
        await store.add(make_lease("c", (2,)))  # the disk turned slow: this one held the loop
        assert store.writer.loop_commits == 2
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.002)

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        await store.add(make_lease("d", (3,)))  # the thread writes it: the loop goes on
        ticking.cancel()
        assert store.writer.loop_commits == 2 and len(ticks) >= 20, (store.writer.loop_commits, len(ticks))
        slow["seconds"] = 0.0
        fast_on_thread = 0
        for n in range(40):  # the average comes down commit by commit, then the loop again
            await store.remove("abcd"[n % 4])[1]
            before = store.writer.loop_commits
            await store.add(make_lease("abcd"[n % 4], (n % 4,)))
            fast_on_thread += store.writer.loop_commits == before
        # 0.11 comes down by a fifth a commit: four fast commits (two grants) on the thread
        assert 2 <= fast_on_thread < 40, fast_on_thread
        assert store.writer.loop_commits > 10
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert writers[2] == loop_thread and writers[3] != loop_thread, writers[:4]
    store.close()


def test_commits_on_the_loop_and_on_the_thread_keep_the_order_of_the_changes(tmp_path, monkeypatch):
    """Grants and releases of the same GPUs, queued alone or several to a turn, while the
    disk is now fast, now slow: the loop and the thread take turns at committing, and
    every change lands in the order it was queued (a release written before its grant
    would leave a row the mirror does not have)."""
    _fast_disks(monkeypatch)
    rng, disk = random.Random(26), random.Random(62)
    store = LeaseStore(tmp_path)
    spans: list[tuple[float, float]] = []
    writers = _watch_transactions(store, lambda: disk.choice((0.0, 0.0, 0.0, 0.0, 0.004)), spans)

    async def scenario() -> int:
        await store.add(make_lease("warm", (5,)))
        # A batch the thread writes slowly, and a lone change queued meanwhile: the loop
        # must not write it alongside (one connection, one transaction at a time).
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
    on_loop = writers.count(loop_thread)
    assert 0 < on_loop < len(writers), (on_loop, len(writers))
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
