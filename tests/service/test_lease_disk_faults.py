"""Disk faults and stalls under the lease writer: a fault inside a commit that is no
SQLite error fails that change alone and the writer goes on (on the loop or the thread);
a write that does not end is reported while it lasts; the database is the daemon's
alone and never mapped, so database files made immutable fail writes clearly, not with
SIGBUS."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import pytest

from tests.service.lease_store_helpers import _watch_transactions, _writer_idle, make_lease
from topod.service.lease_store import LeaseStore, LeaseStoreError


def test_a_fault_that_is_no_sqlite_error_fails_its_change_and_the_writer_goes_on(tmp_path):
    """A bug or MemoryError inside a commit: that change is undone and its client told,
    health says writes fail, and the next change is written (the writer thread alive, the
    loop not stalled)."""
    store = LeaseStore(tmp_path)
    real = store.writer._transaction
    faults = ["a bug in the middle of a commit"]

    def faulty(batch, *, isolate):
        if faults:
            raise RuntimeError(faults.pop())
        return real(batch, isolate=isolate)

    async def scenario() -> None:
        await store.add(make_lease("a", (0,)))
        await _writer_idle(store)
        store.writer._transaction = faulty
        with pytest.raises(LeaseStoreError, match="a bug in the middle of a commit"):
            await asyncio.wait_for(store.add(make_lease("b", (1,))), 5)
        assert store.get("b") is None and store.holder_of("0000:11:00.0") is None, "undone"
        assert "a bug in the middle of a commit" in store.writer.problem()
        await asyncio.wait_for(store.add(make_lease("c", (1,))), 5)
        assert store.writer.problem() is None

    asyncio.run(scenario())
    assert store.writer._thread.is_alive()
    store.close()
    reopened = LeaseStore(tmp_path)
    assert sorted(lease.id for lease in reopened.all()) == ["a", "c"]
    reopened.close()


def test_a_write_that_does_not_end_is_reported_while_it_lasts(tmp_path, monkeypatch):
    """A disk that stops answering: the commit waits (nothing undone, it may still land)
    and health's problem says so until it ends; the loop goes on meanwhile."""
    import topod.service.lease_writer as lease_writer

    monkeypatch.setattr(lease_writer, "STALLED_WRITE_SECONDS", 0.2)
    store = LeaseStore(tmp_path)
    _watch_transactions(store, lambda: 0.6)
    seen: list[str | None] = []

    async def scenario() -> None:
        commit = store.add(make_lease("a", (0,)))  # the first commit: the thread's
        for _ in range(8):
            await asyncio.sleep(0.1)
            seen.append(store.writer.problem())
        await commit

    asyncio.run(scenario())
    assert seen[0] is None and any(p and "lease write stalled" in p for p in seen), seen
    assert store.writer.problem() is None and store.get("a") is not None
    store.close()


def test_the_database_is_the_daemons_alone_and_never_mapped(tmp_path, monkeypatch):
    """EXCLUSIVE locking: no -shm file is mapped (a fault in a mapping is SIGBUS, the death
    of the daemon), and a second store on the same state dir is one clear refusal."""
    import topod.service.lease_db as lease_db

    monkeypatch.setattr(lease_db, "BUSY_TIMEOUT_MS", 100)
    store = LeaseStore(tmp_path)
    store.add(make_lease("a", (0,)))
    assert not (tmp_path / "leases.sqlite3-shm").exists()
    with pytest.raises(LeaseStoreError, match="held by another process"):
        LeaseStore(tmp_path)
    other = sqlite3.connect(store.path, timeout=0.1)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        other.execute("INSERT INTO meta VALUES ('x', 'y')")
    other.close()
    assert [lease.id for lease in store.all()] == ["a"]
    store.close()


IMMUTABLE_SCENARIO = """
import asyncio, subprocess, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.service.lease_store_helpers import make_lease
from topod.service.lease_store import LeaseStore, LeaseStoreError

state = Path({state!r})
store = LeaseStore(state)

async def main():
    await store.add(make_lease("a", (0,)))
    files = sorted(str(p) for p in state.iterdir())
    subprocess.run(["chattr", "+i", *files], check=True)
    try:
        await store.add(make_lease("b", (1,)))
        print("GRANTED")
    except LeaseStoreError as exc:
        print("REFUSED", exc)
    print("PROBLEM", store.problem())
    print("MIRROR", sorted(lease.id for lease in store.all()))
    subprocess.run(["chattr", "-i", *files], check=True)

asyncio.run(main())
"""


def test_database_files_made_immutable_fail_writes_clearly_not_with_sigbus(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if shutil.which("chattr") is None or os.geteuid() != 0:
        pytest.skip("needs chattr and root (the immutable attribute)")
    probe = tmp_path / "probe"
    probe.touch()
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable attribute")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    repo = str(Path(__file__).resolve().parents[2])
    state = tmp_path / "state"
    try:
        done = subprocess.run([sys.executable, "-c", IMMUTABLE_SCENARIO.format(repo=repo, state=str(state))],
                              capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["chattr", "-R", "-i", str(state)], capture_output=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # 135 was SIGBUS
    assert "REFUSED" in done.stdout and "GRANTED" not in done.stdout, done.stdout
    assert "PROBLEM lease writes failing" in done.stdout
    assert "MIRROR ['a']" in done.stdout, "the refused grant left nothing behind"
