"""The lease store's mirror: a change shows in it at once; a GPU already leased is
refused before anything is queued, and the database refuses what the mirror missed; a
commit that fails is undone in the mirror (the lease, its GPUs and CPUs) and only that
change fails in its batch; removes and updates are durable; a closed store refuses
changes clearly."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from tests.service.lease_store_helpers import _another_writer_takes, make_lease
from topod.service.lease_store import LeaseConflictError, LeaseStore, LeaseStoreError


def test_a_gpu_in_two_leases_is_refused_before_it_is_queued(tmp_path):
    store = LeaseStore(tmp_path)
    store.add(make_lease("a", (0, 1)))
    with pytest.raises(LeaseConflictError):
        store.add(make_lease("b", (1, 2)))
    assert [lease.id for lease in store.all()] == ["a"]
    assert store.holder_of("0000:11:00.0") == "a" and store.holder_of("0000:12:00.0") is None
    store.close()


def test_the_database_refuses_a_double_grant_the_mirror_missed(tmp_path):
    store = LeaseStore(tmp_path)
    store.add(make_lease("a", (0,)))
    with pytest.raises(sqlite3.IntegrityError):
        store.writer._db.execute("INSERT INTO lease_devices VALUES ('0000:10:00.0', 'b')")
    store.close()


def test_a_failed_commit_is_undone_in_the_mirror_and_reported(tmp_path):
    store = LeaseStore(tmp_path)

    async def scenario():
        store.add(make_lease("a", (0,)))
        # Another writer sneaks the same GPU in on disk: the grant's commit fails.
        _another_writer_takes(store, "0000:11:00.0")
        commit = store.add(make_lease("b", (1,)))
        assert store.get("b") is not None, "the mirror shows the change at once"
        with pytest.raises(LeaseConflictError):
            await commit
        assert store.get("b") is None and store.holder_of("0000:11:00.0") is None, "undone"

    asyncio.run(scenario())
    store.close()


def test_one_failing_change_in_a_batch_fails_alone(tmp_path):
    """A batch is written straight first; a statement that fails makes the writer write
    it again with a savepoint per change, so the other changes of the batch still land."""
    store = LeaseStore(tmp_path)

    async def scenario():
        store.add(make_lease("a", (0,)))
        _another_writer_takes(store, "0000:13:00.0")
        commits = [store.add(make_lease(f"l{g}", (g,))) for g in (1, 2, 3, 4, 5)]
        results = await asyncio.gather(*commits, return_exceptions=True)
        failed = [lease for lease, r in zip((1, 2, 3, 4, 5), results) if isinstance(r, Exception)]
        assert failed == [3] and isinstance(results[2], LeaseConflictError), results

    asyncio.run(scenario())
    assert sorted(lease.id for lease in store.all()) == ["a", "l1", "l2", "l4", "l5"]
    store.close()
    db = sqlite3.connect(store.path)
    on_disk = sorted(row[0] for row in db.execute("SELECT id FROM leases"))
    db.close()
    assert on_disk == ["a", "ghost", "l1", "l2", "l4", "l5"]


def test_remove_and_update_are_durable(tmp_path):
    store = LeaseStore(tmp_path)

    async def scenario():
        await store.add(make_lease("a", (0,)))
        await store.add(make_lease("b", (1,)))
        _, commit = store.remove("a")
        await commit
        from dataclasses import replace

        await store.update(replace(store.get("b"), state="preempting", preempt_deadline=5.0))

    asyncio.run(scenario())
    store.close()
    reopened = LeaseStore(tmp_path)
    assert [(l.id, l.state, l.preempt_deadline) for l in reopened.all()] == [("b", "preempting", 5.0)]
    assert reopened.get("b").decision.performance.weakest_pair == "NV18"
    reopened.close()


def test_a_closed_store_refuses_changes_clearly(tmp_path):
    store = LeaseStore(tmp_path)

    async def scenario():
        await store.add(make_lease("a", (0,)))
        store.close()
        with pytest.raises(LeaseStoreError):
            store.add(make_lease("b", (1,)))
        assert store.get("b") is None and store.holder_of("0000:11:00.0") is None

    asyncio.run(scenario())


def test_the_mirror_keeps_leased_cpus_through_adds_removes_and_undos(tmp_path):
    store = LeaseStore(tmp_path)

    async def scenario():
        await store.add(make_lease("a", (0, 1)))
        assert store.leased_cpus() == {0, 1, 2, 3}
        _, commit = store.remove("a")
        await commit
        assert store.leased_cpus() == set()
        _another_writer_takes(store, "0000:12:00.0")
        failing = store.add(make_lease("b", (2,)))
        assert store.leased_cpus() == {4, 5}
        with pytest.raises(LeaseConflictError):
            await failing
        assert store.leased_cpus() == set(), "undone with the lease"

    asyncio.run(scenario())
    store.close()
