"""A lease on the MI300X host tells its job what ROCm reads: ROCR_VISIBLE_DEVICES by the
GPUs' GPU-<unique_id> names and never CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES beside it
(HIP indexes what ROCr left, renumbered from 0: the same list would select nothing), and
RCCL's NCCL_IB_HCA with the NICs under the GPUs' own switches."""

from __future__ import annotations

import asyncio
import os

from topod.api.peer import Caller
from topod.config import load_config
from topod.discover.scan import discover
from topod.events import EventBus
from topod.host import HostRoot
from topod.service.lease_store import LeaseStore
from topod.service.leases import LeaseService
from topod.service.state import HostState

ALICE = Caller(uid=4242, gid=4242, pid=os.getpid(), may_allocate=True, is_admin=False)


def test_amd_lease_environment_names_rocm_devices_and_rccl_nics(host_tree, tmp_path):
    topology = discover(HostRoot(host_tree("mi300x-8gpu")), live_nvml=False)
    store = LeaseStore(tmp_path / "state")
    try:
        service = LeaseService(HostState(topology), store, EventBus(), dict(load_config(None).section("alloc")), set())
        lease = asyncio.run(service.allocate({"gpus": 2}, ALICE))
        env = service.environment(lease)
    finally:
        store.close()
    gpus = [topology.gpu(i) for i in lease.gpus]
    assert env["ROCR_VISIBLE_DEVICES"] == ",".join(gpu.amd.rocr_uuid for gpu in gpus)
    assert "CUDA_VISIBLE_DEVICES" not in env and "HIP_VISIBLE_DEVICES" not in env
    assert {gpu.numa_node for gpu in gpus} == {0}
    hcas = env["NCCL_IB_HCA"].lstrip("=").split(",")
    assert sorted(h.split(":")[0] for h in hcas) == [f"mlx5_{i}" for i in lease.gpus]
