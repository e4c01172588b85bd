"""The ledger under faults of its own files, on the daemon as users start it (its defaults
plus --root, --socket, --state-dir): whatever happens to the database, its WAL, a journal
or the state dir while topod runs, every lease told 201 is back after `kill -9` (or a
SIGTERM) and a restart, and no change answered with an error ever is."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from topod.client import ApiError


def _ledger(daemon) -> Path:
    return Path(daemon.state) / "leases.sqlite3"


def _delete_wal(path: Path) -> None:
    os.unlink(f"{path}-wal")


def _delete_database(path: Path) -> None:
    os.unlink(path)


def _replace_database_by_its_copy(path: Path) -> None:
    copy = path.with_name("copy")
    shutil.copyfile(path, copy)
    os.rename(copy, path)


def _plant_a_journal(path: Path) -> None:
    Path(f"{path}-journal").write_bytes(b"\0" * 512)


def _move_the_state_dir_away(path: Path) -> None:
    os.rename(path.parent, path.parent.with_name("state.moved"))


FAULTS = {"wal deleted": _delete_wal, "database deleted": _delete_database,
          "database replaced by its copy": _replace_database_by_its_copy, "journal planted": _plant_a_journal,
          "state dir moved away": _move_the_state_dir_away}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_every_acknowledged_lease_survives_a_fault_of_the_ledger_files_and_a_restart(daemon_factory, fault, stop):
    daemon = daemon_factory(config=None)
    client = daemon.start()
    before = [client.allocate(1, level="any", cpus_per_gpu=0)["id"] for _ in range(3)]
    FAULTS[fault](_ledger(daemon))
    after = [client.allocate(1, level="any", cpus_per_gpu=0)["id"] for _ in range(2)]
    client.release(before[0])
    health = client.health()
    assert health["status"] == "ok", health["degraded"]
    assert health["commits"]["ledger_rebuilds"] == 1
    assert "lease_ledger_rebuilt" in daemon.log()
    daemon.stop(getattr(signal, stop))
    client = daemon.start()
    assert sorted(lease["id"] for lease in client.leases()) == sorted(before[1:] + after)
    assert not Path(f"{_ledger(daemon)}-journal").exists()


def test_a_grant_refused_because_the_ledger_cannot_be_rebuilt_is_never_back_after_a_restart(daemon_factory):
    """The state dir moved away and a file put at its path: the ledger cannot be rebuilt,
    grants are refused (500), health says why. Put back, after `kill -9`: the leases told
    201 are there and none of the refused ones."""
    daemon = daemon_factory(config=None)
    client = daemon.start()
    kept = client.allocate(1, level="any", cpus_per_gpu=0)["id"]
    state = Path(daemon.state)
    os.rename(state, state.with_name("state.moved"))
    state.write_text("not a directory")
    refused = 0
    for _ in range(3):
        with pytest.raises(ApiError) as caught:
            client.allocate(1, level="any", cpus_per_gpu=0)
        assert caught.value.status == 500 and caught.value.code == "state_write_failed", caught.value
        refused += 1
    health = client.health()
    assert health["status"] == "degraded"
    assert any("rebuilding it failed" in reason for reason in health["degraded"]), health["degraded"]
    assert len(client.leases()) == 1, "a refused grant holds nothing"
    daemon.stop(signal.SIGKILL)
    state.unlink()
    os.rename(state.with_name("state.moved"), state)
    client = daemon.start()
    assert [lease["id"] for lease in client.leases()] == [kept]


def _until(condition, timeout: float = 15.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture()
def small_disk(tmp_path):
    """A 16 MiB tmpfs (root only: skipped elsewhere), unmounted after the test."""
    import subprocess

    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\xff" * (1 << 16))
                out.flush()
        except OSError:
            pass
    return filler


def test_a_full_state_disk_refuses_grants_before_releases_and_health_says_so_until_room_is_back(daemon_factory,
                                                                                                 small_disk):
    daemon = daemon_factory(config=None)
    daemon.state = str(small_disk / "state")
    client = daemon.start()
    held = [client.allocate(1, level="any", cpus_per_gpu=0)["id"] for _ in range(4)]
    filler = _fill(small_disk)
    told: list[str] = []
    refusals = []
    for _ in range(4):  # the first may still be written (and is then told 201): the floor is checked after it
        try:
            told.append(client.allocate(1, level="any", cpus_per_gpu=0)["id"])
        except ApiError as exc:
            refusals.append(exc)
    assert refusals and all(exc.status == 507 and exc.code == "state_disk_full" and exc.retryable
                            for exc in refusals), refusals
    for lease_id in held:
        client.release(lease_id)  # every release goes through on the full disk
    health = client.health()
    assert health["status"] == "degraded" and any("grants refused" in r for r in health["degraded"]), health
    filler.unlink()
    assert _until(lambda: client.health()["status"] == "ok"), client.health()["degraded"]
    told.append(client.allocate(1, level="any", cpus_per_gpu=0)["id"])
    daemon.stop(signal.SIGKILL)
    client = daemon.start()
    assert sorted(lease["id"] for lease in client.leases()) == sorted(told)


@pytest.fixture()
def freezable_disk(tmp_path):
    """A 32 MiB ext4 on a loop device that fsfreeze can stop (root only: skipped elsewhere)."""
    import subprocess

    image, mount = tmp_path / "disk.img", tmp_path / "freezable"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("fsfreeze") is None or shutil.which("mkfs.ext4") is None:
        pytest.skip("a frozen filesystem needs root, fsfreeze and mkfs.ext4")
    with open(image, "wb") as out:
        out.truncate(32 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", str(image)], capture_output=True, text=True)
    mounted = made.returncode == 0 and subprocess.run(["mount", "-o", "loop", str(image), str(mount)],
                                                      capture_output=True).returncode == 0
    if not mounted:
        pytest.skip(f"cannot loop-mount an ext4 here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["fsfreeze", "-u", str(mount)], capture_output=True)
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_frozen_state_disk_never_stops_health_or_the_watchdog_and_health_says_the_write_stalled(
        daemon_factory, freezable_disk, tmp_path):
    """The state dir's filesystem frozen for 8 s right after fast commits: health answers
    within a second throughout, the watchdog keeps pinging, health says the lease write is
    stalled, and the grant caught in the freeze is answered 201 once the disk thaws."""
    import subprocess
    import threading
    import time

    from tests.service.daemon_scenario import NotifyListener

    notify = NotifyListener(tmp_path / "notify.sock")
    daemon = daemon_factory(config=None, env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000"})
    daemon.state = str(freezable_disk / "state")
    client = daemon.start()
    for _ in range(4):  # fast commits first: once they made the loop write a lone change itself
        client.release(client.allocate(1, level="any", cpus_per_gpu=0)["id"])
    outcome: dict = {}

    def grant() -> None:
        try:
            outcome["lease"] = client.allocate(1, level="any", cpus_per_gpu=0)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            outcome["error"] = exc

    subprocess.run(["fsfreeze", "-f", str(freezable_disk)], check=True)
    try:
        frozen_at = time.monotonic()
        caught = threading.Thread(target=grant, daemon=True)
        caught.start()
        slowest, reasons = 0.0, []
        while time.monotonic() - frozen_at < 8.0:
            asked = time.monotonic()
            health = client.health()
            slowest = max(slowest, time.monotonic() - asked)
            reasons += health["degraded"]
            time.sleep(0.2)
        pings = notify.pings_since(frozen_at)
    finally:
        subprocess.run(["fsfreeze", "-u", str(freezable_disk)], check=True)
    caught.join(timeout=15)
    notify.close()
    assert slowest < 1.0, f"health took {slowest:.2f} s during the freeze"
    assert pings >= 10, f"{pings} watchdog pings in 8 s (every 0.5 s expected)"
    assert any("lease write stalled for" in reason for reason in reasons), reasons
    assert "lease" in outcome, outcome
    assert outcome["lease"]["id"] in {lease["id"] for lease in client.leases()}
    assert _until(lambda: client.health()["status"] == "ok"), client.health()["degraded"]
