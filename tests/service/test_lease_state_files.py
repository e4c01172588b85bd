"""The state directory and the files the store finds in it: made private whatever the
umask; a database written by topod 0.1 upgraded with every lease; a state dir that is a
file, a link, a FIFO, a damaged database or an unreadable lease row is one clear error
that changes and deletes nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import stat

import pytest

from tests.service.lease_store_helpers import _another_writer_takes, make_lease
from topod.errors import TopodError
from topod.service.lease_store import LeaseStore, LeaseStoreError


def test_an_unreadable_lease_row_stops_the_store_with_its_id_and_loses_nothing(tmp_path):
    store = LeaseStore(tmp_path)
    store.add(make_lease("a", (0,)))
    store.close()
    _another_writer_takes(store, "0000:13:00.0")  # body '{}': not a lease
    with pytest.raises(TopodError, match="lease 'ghost' is unreadable"):
        LeaseStore(tmp_path)
    db = sqlite3.connect(store.path)
    assert sorted(row[0] for row in db.execute("SELECT id FROM leases")) == ["a", "ghost"], "nothing deleted"
    db.close()


def test_state_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        store = LeaseStore(tmp_path / "state")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    store.close()


def test_a_database_written_by_topod_0_1_is_upgraded_with_every_lease(tmp_path):
    db = sqlite3.connect(tmp_path / "leases.sqlite3")
    db.executescript("""
        CREATE TABLE leases (id TEXT PRIMARY KEY, body TEXT NOT NULL);
        CREATE TABLE lease_gpus (gpu INTEGER PRIMARY KEY, lease_id TEXT NOT NULL);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
    """)
    old = {"id": "old1", "state": "active", "owner_uid": 0, "owner_gid": 0, "requester_pid": 7, "owner_pid": 99,
           "job": "j", "priority": 3, "preemptible": True, "gpus": [2, 3], "cpus": [4, 5, 6, 7], "memory_nodes": [0],
           "created": 10.0, "expires": None, "ttl_seconds": None, "preempt_deadline": None,
           "decision": {"gpus_indices": [2, 3], "gpus": [
               {"index": 2, "address": "0000:12:00.0", "numa_node": 0, "cpus": [4, 5], "cpu_node": 0, "memory_node": 0},
               {"index": 3, "address": "0000:13:00.0", "numa_node": 0, "cpus": [6, 7], "cpu_node": 0, "memory_node": 0}],
               "cpus": [4, 5, 6, 7], "memory_nodes": [0], "numa_nodes": [0], "cost": 2.0, "best_cost": 2.0,
               "level": "best", "requested_level": "good", "satisfaction": 1.0,
               "performance": {"relative_allreduce_bandwidth": 1.0, "weakest_pair": "PIX", "weakest_pair_gbps": 25.0,
                               "level_floors": {}}, "exact": True, "cpu_fallback": False, "reasons": [],
               "owner_start_time": 123.5, "environment": {"TOPOD_LEASE": "old1"}}}
    db.execute("INSERT INTO leases VALUES ('old1', ?)", (json.dumps(old),))
    db.executemany("INSERT INTO lease_gpus VALUES (?, 'old1')", [(2,), (3,)])
    db.commit()
    db.close()
    store = LeaseStore(tmp_path)
    lease = store.get("old1")
    assert lease.gpus == (2, 3) and lease.cpus == (4, 5, 6, 7) and lease.owner_start_time == 123.5
    assert lease.environment == {"TOPOD_LEASE": "old1"} and lease.owner_pid == 99
    assert store.holder_of("0000:13:00.0") == "old1"
    store.close()
    check = sqlite3.connect(tmp_path / "leases.sqlite3")
    assert check.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
    assert check.execute("SELECT count(*) FROM lease_devices").fetchone() == (2,)
    check.close()


def test_a_state_dir_that_is_a_file_or_cannot_be_made_is_one_clear_error(tmp_path):
    taken = tmp_path / "state"
    taken.write_text("not a directory")
    with pytest.raises(LeaseStoreError, match="state directory .*/state: exists and is not a directory"):
        LeaseStore(taken)
    with pytest.raises(LeaseStoreError, match="state directory .*/state/sub: cannot create it: Not a directory"):
        LeaseStore(taken / "sub")
    assert taken.read_text() == "not a directory"


def test_a_link_fifo_or_damaged_file_in_the_state_dir_is_refused_and_left_as_it_is(tmp_path):
    """A link in the database's place was followed: the store chmod'ed its target (it
    made /dev/zero 0600). Now nothing but the store's own regular files is opened or
    changed, and a damaged database is named, not wrapped in an internal error."""
    outside = tmp_path / "outside"
    outside.write_text("someone else's")
    os.chmod(outside, 0o644)
    cases = {
        "leases.sqlite3": lambda path: path.symlink_to(outside),
        "leases.sqlite3-wal": lambda path: path.symlink_to(outside),
        "leases.sqlite3-shm": lambda path: os.mkfifo(path),
    }
    for name, plant in cases.items():
        state = tmp_path / f"state-{name}"
        state.mkdir()
        plant(state / name)
        with pytest.raises(LeaseStoreError, match=f"{name}: (a symbolic link|a FIFO), not the lease database"):
            LeaseStore(state)
        assert sorted(p.name for p in state.iterdir()) == [name]  # nothing made beside it
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o644 and outside.read_text() == "someone else's"
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    garbage = os.urandom(4096)
    (damaged / "leases.sqlite3").write_bytes(garbage)
    with pytest.raises(LeaseStoreError, match="leases.sqlite3: file is not a database.*move it away"):
        LeaseStore(damaged)
    assert (damaged / "leases.sqlite3").read_bytes() == garbage
