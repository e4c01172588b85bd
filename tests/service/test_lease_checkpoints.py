"""WAL checkpoints: the writer runs them between batches (never SQLite's own, inside a
commit an answer waits for), so the WAL stays bounded; one waits for a quiet moment but
not for ever; one that fails is logged and loses nothing."""

from __future__ import annotations

import asyncio
import sqlite3

from tests.service.lease_store_helpers import make_lease
from topod.service.lease_writer import QueuedChange
from topod.service.lease_store import LeaseStore


def test_checkpoints_run_between_batches_and_the_wal_stays_bounded(tmp_path, monkeypatch):
    import topod.service.lease_db as lease_db
    import topod.service.lease_writer as lease_writer

    monkeypatch.setattr(lease_writer, "CHECKPOINT_EVERY_COMMITS", 4)
    # On a loaded machine the next change may already wait at every quiet check (the
    # loop queues it while the writer settles the last): the forced checkpoint still
    # comes, so the counts and the WAL's bound below hold however the threads interleave.
    monkeypatch.setattr(lease_writer, "CHECKPOINT_FORCE_COMMITS", 8)
    # no room reserved ahead (test_lease_wal_reserve): the file's size is then what it holds
    monkeypatch.setattr(lease_db, "WAL_RESERVE_BYTES", 0)
    store = LeaseStore(tmp_path)
    # SQLite's own checkpoint (inside a COMMIT, so inside an answer's wait) is off
    assert store.writer._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    wal = tmp_path / "leases.sqlite3-wal"

    async def churn(rounds: int) -> None:
        for n in range(rounds):  # one change per commit, nothing waiting between them
            await store.add(make_lease(f"l{n}", (n % 8,)))
            await store.remove(f"l{n}")[1]

    asyncio.run(churn(40))
    store.flush()
    # one every 4 commits when nothing waits, every 8 at the latest
    assert store.writer.checkpoints >= 10 and store.commits >= 80, (store.writer.checkpoints, store.commits)
    # checkpointed WAL frames are reused: the WAL holds at most the commits since the
    # last checkpoint (9, a few pages each); 80 commits unchecked would be ~1 MB
    bound = 9 * 6 * (4096 + 24) + 32
    assert wal.stat().st_size <= bound, wal.stat().st_size
    asyncio.run(churn(40))
    assert wal.stat().st_size <= bound, wal.stat().st_size
    store.add(make_lease("kept", (3,)))
    store.close()
    assert wal.stat().st_size == 0 if wal.exists() else True  # closed with a TRUNCATE checkpoint
    reopened = LeaseStore(tmp_path)
    assert [lease.id for lease in reopened.all()] == ["kept"]
    reopened.close()


def test_a_checkpoint_waits_for_a_quiet_moment_but_not_for_ever(tmp_path, monkeypatch):
    import topod.service.lease_writer as lease_writer

    monkeypatch.setattr(lease_writer, "CHECKPOINT_EVERY_COMMITS", 2)
    monkeypatch.setattr(lease_writer, "CHECKPOINT_FORCE_COMMITS", 6)
    store = LeaseStore(tmp_path)
    store.writer._pending.append(QueuedChange([], lambda: None, None, None))  # a change always waiting
    store.writer._urgent = 1
    for n in range(5):
        store.writer._unchecked_commits = n
        store.writer._checkpoint_if_due()
    assert store.writer.checkpoints == 0, "due, but a change waits: the answer goes first"
    store.writer._unchecked_commits = 6
    store.writer._checkpoint_if_due()
    assert store.writer.checkpoints == 1 and store.writer._unchecked_commits == 0, "overdue: done regardless"
    store.writer._pending.clear()
    store.writer._urgent = 0
    store.writer._unchecked_commits = 2
    store.writer._checkpoint_if_due()
    assert store.writer.checkpoints == 2, "due and quiet"
    store.close()


def test_a_failing_checkpoint_is_logged_and_loses_nothing(tmp_path, monkeypatch):
    import topod.service.lease_writer as lease_writer

    monkeypatch.setattr(lease_writer, "CHECKPOINT_EVERY_COMMITS", 1)
    calls = []

    class Refusing:
        def __init__(self, connection):
            self.connection = connection

        def execute(self, sql, *args):
            if "wal_checkpoint(PASSIVE)" in sql:
                calls.append(sql)
                raise sqlite3.OperationalError("disk I/O error")
            return self.connection.execute(sql, *args)

        def executemany(self, sql, *args):
            return self.connection.executemany(sql, *args)

        def close(self):
            self.connection.close()

    store = LeaseStore(tmp_path)
    store.writer._db = Refusing(store.writer._db)

    async def grant() -> None:
        await store.add(make_lease("a", (0,)))
        await store.add(make_lease("b", (1,)))

    asyncio.run(grant())
    store.flush()
    assert calls and store.writer.checkpoints == 0
    store.close()
    reopened = LeaseStore(tmp_path)
    assert sorted(lease.id for lease in reopened.all()) == ["a", "b"]
    reopened.close()
