"""The WAL's room reserved ahead (topod.service.lease_db.reserve_wal): a start's commits
overwrite blocks the file has instead of growing it (each growth made fdatasync write the
file's size too, on every one of a fresh daemon's first grants). The
zeros must never read as frames: what was committed before them, and only that, comes
back after a crash."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.service.lease_store_helpers import make_lease
from topod.service import lease_db
from topod.service.lease_store import LeaseStore

REPO = Path(__file__).resolve().parents[2]


def test_the_first_thread_commit_reserves_the_wal_and_commits_then_overwrite_it(tmp_path):
    store = LeaseStore(tmp_path)
    wal = tmp_path / "leases.sqlite3-wal"
    try:
        assert wal.stat().st_size < lease_db.WAL_RESERVE_BYTES
        store.add(make_lease("kept", (7,)))  # no event loop: written at once, by this thread
        assert wal.stat().st_size < lease_db.WAL_RESERVE_BYTES
        asyncio.run(_churn(store, 1))  # the first queued change is the thread's (no commit time known yet)
        store.flush()
        assert wal.stat().st_size == lease_db.WAL_RESERVE_BYTES
        asyncio.run(_churn(store, 30))  # 60 commits of a few pages: inside the room, no growth
        store.flush()
        assert wal.stat().st_size == lease_db.WAL_RESERVE_BYTES
        assert [lease.id for lease in store.all()] == ["kept"]
    finally:
        store.close()


async def _churn(store: LeaseStore, rounds: int) -> None:
    for n in range(rounds):  # a lease added, then removed: two commits
        await store.add(make_lease(f"gone{n}", (n % 7,)))
        await store.remove(f"gone{n}")[1]


def test_a_crash_after_the_reserve_brings_back_what_was_committed_and_nothing_else(tmp_path):
    """The state dir copied while topod runs (what a power loss leaves: the WAL's frames,
    then the zeros; no checkpoint, no TRUNCATE at close) opens with exactly the leases
    committed."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    store = LeaseStore(live)
    try:
        async def grant_and_churn() -> None:
            for n in range(3):
                await store.add(make_lease(f"kept{n}", (4 + n,)))
            await _churn(store, 4)

        asyncio.run(grant_and_churn())
        store.flush()
        assert (live / "leases.sqlite3-wal").stat().st_size == lease_db.WAL_RESERVE_BYTES
        with store.writer._db_lock:  # no write in flight while the files are copied
            crashed.mkdir(mode=0o700)
            for name in ("leases.sqlite3", "leases.sqlite3-wal"):
                shutil.copy2(live / name, crashed / name)
    finally:
        store.close()
    reopened = LeaseStore(crashed)
    try:
        assert sorted(lease.id for lease in reopened.all()) == ["kept0", "kept1", "kept2"]
        reopened.add(make_lease("after", (0,)))  # and it takes commits again
        assert sorted(lease.id for lease in reopened.all()) == ["after", "kept0", "kept1", "kept2"]
    finally:
        reopened.close()


def test_reserve_extends_with_zeros_past_the_end_and_never_touches_what_is_there(tmp_path):
    path = tmp_path / "db"
    wal = tmp_path / "db-wal"
    wal.write_bytes(b"frames" * 1000)
    assert lease_db.reserve_wal(path, size=64 * 1024) is None
    data = wal.read_bytes()
    assert len(data) == 64 * 1024 and data[:6000] == b"frames" * 1000 and data[6000:] == bytes(64 * 1024 - 6000)
    assert lease_db.reserve_wal(path, size=16 * 1024) is None  # already longer: left as it is
    assert wal.read_bytes() == data


def test_reserve_refuses_what_is_not_the_wal_file_and_says_why(tmp_path):
    path = tmp_path / "db"
    assert "No such file" in lease_db.reserve_wal(path, size=4096)  # nothing there: nothing made
    assert not (tmp_path / "db-wal").exists()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    (tmp_path / "db-wal").symlink_to(target)
    said = lease_db.reserve_wal(path, size=4096)
    assert said is not None and "db-wal" in said  # a link is not followed
    assert target.read_bytes() == b"x"
    (tmp_path / "db-wal").unlink()
    os.mkfifo(tmp_path / "db-wal")
    said = lease_db.reserve_wal(path, size=4096)  # no reader: the open fails at once, never blocks
    assert said is not None and "db-wal" in said


def test_a_reserve_the_disk_refuses_gives_the_space_back(tmp_path):
    """A full disk (here: a file size limit, EFBIG) fails the reserve; the blocks written
    before the failure are given back, and what SQLite had is untouched."""
    wal = tmp_path / "db-wal"
    wal.write_bytes(b"frames" * 1000)
    script = ("import resource, signal, sys; from topod.service.lease_db import reserve_wal; "
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20)); "
              "print(reserve_wal(sys.argv[1], size=8 << 20))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "db")], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60, check=True)
    assert "File too large" in done.stdout, done.stdout
    assert wal.read_bytes() == b"frames" * 1000


def test_a_failed_reserve_is_logged_and_the_store_goes_on(tmp_path, monkeypatch):
    import topod.service.lease_writer as lease_writer

    said: list[tuple[str, dict]] = []
    monkeypatch.setattr(lease_writer, "reserve_wal", lambda path: "leases.sqlite3-wal: No space left on device")
    monkeypatch.setattr(lease_writer.log, "warning", lambda event, **fields: said.append((event, fields)))
    store = LeaseStore(tmp_path)
    try:
        asyncio.run(_churn(store, 3))
        store.flush()
        assert said == [("lease_wal_not_reserved", {"reason": "leases.sqlite3-wal: No space left on device"})]
        assert store.all() == [] and store.commits >= 6  # every change written after the failed reserve
    finally:
        store.close()


def test_a_reserve_the_disk_never_finishes_shows_as_a_stalled_write(tmp_path, monkeypatch):
    import threading
    import time

    import topod.service.lease_writer as lease_writer

    release = threading.Event()
    started = threading.Event()

    def hanging(path):
        started.set()
        release.wait(30)
        return None

    monkeypatch.setattr(lease_writer, "reserve_wal", hanging)
    monkeypatch.setattr(lease_writer, "STALLED_WRITE_SECONDS", 0.05)
    store = LeaseStore(tmp_path)

    async def grant() -> None:  # answered before the reserve begins (its commit is settled first)
        await store.add(make_lease("first", (0,)))

    try:
        asyncio.run(grant())
        assert started.wait(10)
        time.sleep(0.1)
        assert "lease write stalled" in (store.problem() or "")
        release.set()
        store.flush()
        assert store.problem() is None
    finally:
        release.set()
        store.close()
