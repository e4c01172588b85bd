"""The daemon's live isolation on cgroup v2 ([isolate] system = true, method = "cgroup";
issue 28) against a real D-Bus bus with a stand-in systemd (fake_systemd.py): the slices'
runtime AllowedCPUs= follow the leases, the record is in the state directory while they
are narrowed, and a start after kill -9 gives them back. Under the real systemd:
tests/systemd/test_slices.py."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from topod.cpulist import parse_cpulist


UNITS = ("system.slice", "user.slice", "init.scope")
CONFIG = ('[irq]\nmode = "off"\n[probe]\nenabled = false\n'
          '[isolate]\nsystem = true\nmethod = "cgroup"\ninterval_seconds = 1.0\n')


def _until(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_slices_follow_the_leases_and_a_crash_is_repaired_at_start(daemon_factory, systemd):
    daemon = daemon_factory(config=CONFIG, env={"DBUS_SYSTEM_BUS_ADDRESS": systemd.address})
    client = daemon.start()
    record = Path(daemon.state) / "isolation-slices.json"
    online = parse_cpulist((daemon.root / "sys/devices/system/cpu/online").read_text().strip())
    assert systemd.set_calls == [] and not record.exists(), "no lease, nothing narrowed"

    lease = client.allocate(2, cpus_per_gpu=4)
    housekeeping = tuple(sorted(set(online) - set(lease["cpus"])))
    _until(lambda: all(systemd.allowed[u] == housekeeping for u in UNITS), "narrowed to the housekeeping CPUs")
    assert set(json.loads(record.read_text())["units"]) == set(UNITS)
    isolation = client.health()["isolation"]
    assert isolation["method"] == "cgroup" and isolation["effective"] is False
    assert "no effect here" in isolation["reason"] and "captured host tree" in isolation["reason"]

    client.release(lease["id"])
    _until(lambda: all(systemd.allowed[u] == () for u in UNITS), "given back when the last lease ends")
    _until(lambda: not record.exists(), "the record goes with it")

    owner = subprocess.Popen(["sleep", "120"])
    try:
        client.allocate(1, cpus_per_gpu=2, owner_pid=owner.pid)
        _until(lambda: systemd.allowed["system.slice"] != (), "narrowed again")
        daemon.stop(signal.SIGKILL)
        assert record.exists() and systemd.allowed["user.slice"] != (), "kill -9 gives nothing back by itself"
    finally:
        owner.kill()
        owner.wait()
    client = daemon.start()  # the owner is gone: its lease ends, nothing narrows again
    _until(lambda: all(systemd.allowed[u] == () for u in UNITS), "given back at the start after the crash")
    assert not record.exists() and client.leases() == []
    records = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    assert any(r.get("event") == "isolation_restored" and r.get("after") == "crash" for r in records)
