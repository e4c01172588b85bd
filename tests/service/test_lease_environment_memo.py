"""A lease's environment is built once per decision (the engine's memo gives the same
decision again and again) and each lease still gets its own id and files; a topology
change builds it anew. Real LeaseService and LeaseStore on the h800 fixture, no loop (each
change is written before the call returns)."""

from __future__ import annotations

import os

from topod.api.peer import Caller
from topod.record import replace
from topod.service.leases import LeaseService

ROOT = Caller(uid=0, gid=0, pid=os.getpid(), may_allocate=True, is_admin=True)


class Files:
    """LeaseFiles that name one file per lease (as NCCL topology files do)."""

    def lease_environment(self, lease):
        return {"NCCL_TOPO_FILE": f"/run/topod/leases/{lease.owner_uid}/{lease.id}.xml"}

    def lease_has_files(self, lease):
        return False  # nothing to write in this test

    def remove_lease(self, lease):
        pass


def _grant(alloc: LeaseService):
    lease, commit = alloc.start_allocation({"gpus": 1}, ROOT)
    assert commit is None
    return lease


def test_the_same_decision_twice_gives_each_lease_its_own_id_and_files(service):
    service.files = Files()
    first = _grant(service)
    service.start_release(first.id, ROOT)
    second = _grant(service)
    assert second.decision is first.decision, "the memo gave the same decision (what the cache is for)"
    for lease in (first, second):
        assert lease.environment["TOPOD_LEASE"] == lease.id
        assert lease.environment["NCCL_TOPO_FILE"].endswith(f"/{lease.id}.xml")
    assert {k: v for k, v in first.environment.items() if k not in ("TOPOD_LEASE", "NCCL_TOPO_FILE")} == \
        {k: v for k, v in second.environment.items() if k not in ("TOPOD_LEASE", "NCCL_TOPO_FILE")}
    assert list(second.environment)[:4] == ["CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TOPOD_LEASE", "TOPOD_GPUS"]
    assert second.environment is not first.environment
    second.environment["TOPOD_GPUS"] = "changed"  # a lease's own dict: the next one does not see this
    service.start_release(second.id, ROOT)
    third = _grant(service)
    assert third.environment["TOPOD_GPUS"] == first.environment["TOPOD_GPUS"]


def test_the_environment_follows_a_topology_change(service):
    first = _grant(service)
    index = first.gpus[0]
    assert first.environment.get("TOPOD_GPU_MEMORY_NODES") is None or f"{index}:" in first.environment[
        "TOPOD_GPU_MEMORY_NODES"]
    service.start_release(first.id, ROOT)
    topology = service.state.topology
    gpus = tuple(replace(g, memory_numa_node=9) if g.index == index else g for g in topology.gpus)
    assert service.state.set_discovered(replace(service.state.discovered, gpus=gpus))
    second = _grant(service)
    assert second.gpus == first.gpus
    assert second.environment["TOPOD_GPU_MEMORY_NODES"] == f"{index}:9", "built anew for the new topology"
