"""What the lease store says while writes fail: failures are remembered per kind of write
(a later success of another kind does not clear them), grants are refused first when the
state dir's disk runs out of room, and an I/O error is named as one."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
from dataclasses import replace

import pytest

from tests.service.lease_store_helpers import _writer_idle, make_lease
from topod.service import lease_db, lease_writer
from topod.service.lease_store import LeaseStore, LeaseStoreError, LeaseStoreFullError


class _FailingKind:
    """Makes every transaction holding a change of `statement` fail as a full disk would."""

    def __init__(self, store: LeaseStore, statement: str) -> None:
        self.store, self.statement = store, statement
        self.real = store.writer._transaction

    def __enter__(self):
        def failing(batch, *, isolate):
            if any(op.sql and op.sql[0][0] == self.statement for op in batch):
                raise sqlite3.OperationalError("database or disk is full")
            return self.real(batch, isolate=isolate)

        self.store.writer._transaction = failing
        return self

    def __exit__(self, *exc):
        self.store.writer._transaction = self.real


def test_a_failing_release_keeps_health_degraded_while_grants_succeed(tmp_path):
    store = LeaseStore(tmp_path)

    async def scenario() -> list[str | None]:
        await store.add(make_lease("a", (0,)))
        seen = []
        with _FailingKind(store, lease_writer.DELETE_LEASE):
            with pytest.raises(LeaseStoreError):
                await store.remove("a")[1]
            await store.add(make_lease("b", (1,)))  # a grant succeeds meanwhile
            seen.append(store.problem())
        await store.remove("a")[1]  # a release succeeds: that kind is well again
        seen.append(store.problem())
        return seen

    during, after = asyncio.run(scenario())
    assert during is not None and "release: database or disk is full" in during, during
    assert "grant:" not in during
    assert after is None
    store.close()


def test_grants_are_refused_while_the_disk_is_nearly_full_and_releases_still_work(tmp_path, monkeypatch):
    monkeypatch.setattr(lease_writer, "GRANT_FLOOR_BYTES", 1 << 62)  # no disk has this much free
    monkeypatch.setattr(lease_writer, "LOW_SPACE_RECHECK_SECONDS", 0.05)
    store = LeaseStore(tmp_path)

    async def scenario() -> None:
        await store.add(make_lease("a", (0,)))  # written; the check after it finds the disk "full"
        with pytest.raises(LeaseStoreFullError) as refused:
            store.add(make_lease("b", (1,)))
        assert refused.value.code == "state_disk_full" and refused.value.retryable is True
        assert store.get("b") is None and store.holder_of("0000:11:00.0") is None, "nothing held"
        assert "grants refused" in store.problem()
        await store.remove("a")[1]  # a release goes through
        monkeypatch.setattr(lease_writer, "GRANT_FLOOR_BYTES", 0)  # room again
        await _writer_idle(store)
        for _ in range(100):
            if store.writer.space_low is None:
                break
            await asyncio.sleep(0.05)
        assert store.problem() is None, "the periodic check saw the room come back"
        await store.add(make_lease("c", (1,)))

    asyncio.run(scenario())
    store.close()
    reopened = LeaseStore(tmp_path)
    assert [lease.id for lease in reopened.all()] == ["c"]
    reopened.close()


def test_a_write_failing_on_an_io_error_names_the_io_error_not_a_malformed_image(tmp_path, monkeypatch):
    store = LeaseStore(tmp_path)
    real_pread = os.pread

    def eio_on_the_database(fd, length, offset):
        if os.readlink(f"/proc/self/fd/{fd}") == str(store.path):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pread(fd, length, offset)

    async def scenario() -> str | None:
        await store.add(make_lease("a", (0,)))
        monkeypatch.setattr(lease_db.os, "pread", eio_on_the_database)
        real = store.writer._transaction

        def malformed(batch, *, isolate):
            raise sqlite3.DatabaseError("database disk image is malformed")

        store.writer._transaction = malformed
        with pytest.raises(LeaseStoreError):
            await store.add(make_lease("b", (1,)))
        store.writer._transaction = real
        return store.problem()

    problem = asyncio.run(scenario())
    assert "I/O error on the state dir's disk: EIO reading" in problem and str(store.path) in problem, problem
    monkeypatch.undo()
    store.close()


def test_io_fault_is_none_when_the_files_read(tmp_path):
    store = LeaseStore(tmp_path)
    assert lease_db.io_fault(store.path) is None
    store.close()


def test_a_confirmation_the_disk_refused_is_written_again_once_it_takes_it(tmp_path, monkeypatch):
    """A granted lease's confirmation (its answer was written) fails on the disk: the
    lease would end after a crash's grace though its client was told. It is queued again
    until written, and health says confirmations fail meanwhile."""
    from topod.service import lease_store as lease_store_module

    monkeypatch.setattr(lease_store_module, "CONFIRM_RETRY_SECONDS", 0.05)
    store = LeaseStore(tmp_path)

    async def scenario() -> str | None:
        await store.add(replace(make_lease("a", (0,)), confirmed=False))  # granted, its answer not yet written
        with _FailingKind(store, lease_writer.CONFIRM_LEASE):
            with pytest.raises(LeaseStoreError):
                await store.confirm("a")
            assert not store.get("a").confirmed
            during = store.problem()
        for _ in range(100):
            if store.get("a").confirmed and store.problem() is None:
                break
            await asyncio.sleep(0.05)
        return during

    during = asyncio.run(scenario())
    assert during is not None and "confirm:" in during
    assert store.get("a").confirmed and store.problem() is None
    store.close()
    reopened = LeaseStore(tmp_path)
    assert reopened.get("a").confirmed, "the confirmation is on disk"
    reopened.close()
