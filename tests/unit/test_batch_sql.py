"""A group commit's changes merged into a few statements (topod.service.lease_writer): the
same rows in the database as writing each change's own statements in order."""

from __future__ import annotations

import sqlite3

import pytest

from topod.service import lease_writer
from topod.service.lease_writer import CONFIRM_LEASE, DELETE_LEASE, INSERT_DEVICES, INSERT_LEASE, UPDATE_LEASE, merged
from topod.service.lease_db import SCHEMA


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("PRAGMA foreign_keys=ON")
    db.executescript(SCHEMA)
    return db


def _contents(db: sqlite3.Connection) -> tuple[list, list]:
    return (sorted(db.execute("SELECT id, body FROM leases")), sorted(db.execute("SELECT * FROM lease_devices")))


def _one_by_one(db: sqlite3.Connection, changes) -> None:
    for change in changes:
        for statement, params in change:
            (db.executemany if isinstance(params, list) else db.execute)(statement, params)


def _add(lease_id: str, *addresses: str, body: str = '{"confirmed": false}'):
    return [(INSERT_LEASE, (lease_id, body)), (INSERT_DEVICES, [(a, lease_id) for a in addresses])]


def test_a_mixed_batch_leaves_the_same_rows_as_its_changes_one_by_one():
    before = [_add("old1", "0000:01:00.0"), _add("old2", "0000:02:00.0"), _add("old3", "0000:03:00.0")]
    batch = [
        _add("a", "0000:10:00.0", "0000:11:00.0"),
        [(CONFIRM_LEASE, ("old1",))],
        [(UPDATE_LEASE, ('{"state": "preempting"}', "old2"))],
        [(CONFIRM_LEASE, ("old2",))],  # after the update: it must see the updated body
        [(DELETE_LEASE, ("old3",))],
        _add("b", "0000:12:00.0"),
        [(CONFIRM_LEASE, ("a",))],
        [(CONFIRM_LEASE, ("b",))],
        [(DELETE_LEASE, ("b",))],  # granted, confirmed and released in one batch
    ]
    expected, got = _db(), _db()
    for db in (expected, got):
        _one_by_one(db, before)
    _one_by_one(expected, batch)
    statements = merged(batch)
    assert statements is not None and len(statements) < sum(len(change) for change in batch)
    for statement, params in statements:
        got.execute(statement, params)
    assert _contents(got) == _contents(expected)
    leases, devices = _contents(got)
    assert [lease_id for lease_id, _ in leases] == ["a", "old1", "old2"]
    assert ("0000:12:00.0", "b") not in devices and ("0000:03:00.0", "old3") not in devices, "devices go with the lease"


def test_a_confirmation_of_a_lease_deleted_in_the_same_batch_is_dropped():
    statements = merged([_add("a", "x"), [(CONFIRM_LEASE, ("a",))], [(DELETE_LEASE, ("a",))]])
    assert not any("json_set" in statement for statement, _ in statements)


def test_an_unknown_statement_leaves_the_batch_unmerged():
    assert merged([_add("a", "x"), [("DELETE FROM meta", ())]]) is None


def test_a_batch_past_the_chunk_size_is_several_statements_with_every_row(monkeypatch):
    monkeypatch.setattr(lease_writer, "CHUNK", 3)
    batch = [_add(f"l{i}", f"addr{i}") for i in range(10)]
    statements = merged(batch)
    assert len([s for s, _ in statements if s.startswith("INSERT INTO leases")]) == 4
    db = _db()
    for statement, params in statements:
        db.execute(statement, params)
    assert len(_contents(db)[0]) == 10 and len(_contents(db)[1]) == 10


def test_a_merged_statement_that_breaks_a_constraint_fails_as_sqlite_says():
    db = _db()
    _one_by_one(db, [_add("held", "0000:10:00.0")])
    with pytest.raises(sqlite3.IntegrityError):
        for statement, params in merged([_add("a", "0000:20:00.0"), _add("b", "0000:10:00.0")]):
            db.execute(statement, params)
