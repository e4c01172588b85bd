"""The daemon says what it enforces, in /v1/health and in each lease, and never more."""

from __future__ import annotations

from dataclasses import replace

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
