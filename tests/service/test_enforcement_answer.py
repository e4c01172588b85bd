"""The daemon says what it enforces, in /v1/health and in each lease, and never more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from topod.cpulist import format_cpulist
from topod.service.lease import Lease


def test_captured_tree_daemon_claims_no_enforcement_in_health_and_leases(daemon_factory):
    daemon = daemon_factory()
    client = daemon.start()
    health = client.health()
    assert health["enforcement"]["host"] == "none"
    assert health["enforcement"]["leases"] == "none"
    assert "captured host tree" in health["enforcement"]["reason"]
    lease = client.allocate(2, cpus_per_gpu=2)
    assert lease["cpus"], "the lease holds CPUs, yet nothing on this root can hold them"
    assert lease["enforcement"] == "none"
    daemon.stop()
    client = daemon.start()
    (kept,) = client.leases()
    assert kept["id"] == lease["id"] and kept["enforcement"] == "none"


def test_lease_enforcement_survives_the_store_round_trip(daemon_factory):
    client = daemon_factory().start()
    body = client.allocate(1, cpus_per_gpu=1)
    lease = Lease.from_json(body)
    upgraded = replace(lease, enforcement="affinity")
    assert Lease.from_json(upgraded.to_json()).enforcement == "affinity"
    legacy = {k: v for k, v in body.items() if k != "enforcement"}
    assert Lease.from_json(legacy).enforcement == "none", "a lease stored before this field claims nothing"


def test_captured_tree_daemon_isolates_nothing_and_says_why(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "dry-run"\n[probe]\nenabled = false\n[isolate]\nsystem = true\n')
    isolation = daemon.start().health()["isolation"]
    assert isolation["system"] is True and isolation["active"] is False
    assert "captured host tree" in isolation["reason"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_daemon_on_this_host_restores_a_crashed_isolation_record_at_start(daemon_factory, tmp_path):
    """A record left by a daemon killed mid-isolation names the test's own child (narrowed by
    the test): the daemon on the live root gives it its affinity back before serving."""
    cpus = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.sched_setaffinity(child.pid, {cpus[0]})
        stat = Path(f"/proc/{child.pid}/task/{child.pid}/stat").read_text()
        start = int(stat[stat.rfind(")") + 2:].split()[19])
        daemon = daemon_factory(root=Path("/"))
        Path(daemon.state).mkdir()
        (Path(daemon.state) / "isolation.json").write_text(json.dumps({"version": 1, "threads": {str(child.pid): {
            "pid": child.pid, "start": start, "before": format_cpulist(cpus), "set": str(cpus[0])}}}))
        health = daemon.start(timeout=60).health()
        assert health["enforcement"]["host"] in ("affinity", "cgroup")
        assert set(os.sched_getaffinity(child.pid)) == set(cpus)
        assert not (Path(daemon.state) / "isolation.json").exists()
        assert "isolation_restored" in daemon.log()
    finally:
        child.kill()
        child.wait()
