"""A lease's environment: the variables a job runs its lease with (devices, CPUs, memory
nodes, NICs, the lease's id and files). The lease service (topod.service.leases) holds an
EnvironmentBuilder and asks it once per grant; clients (topoctl bind) read it back. Its own
module because the environment is what a lease promises the job, apart from how the grant
is decided: it needs only the lease, the topology's GPUs and the lease's files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from topod.alloc.nics import nic_environment
from topod.cpulist import format_cpulist
from topod.service.lease import DecisionMemo, Lease


class LeaseFiles(Protocol):
    """Files that come with a lease (topod.service.nccl_files.NcclFiles): named in its
    environment, written in a worker thread before the answer, removed when it ends."""

    def lease_environment(self, lease: Lease) -> dict[str, str]: ...
    def lease_has_files(self, lease: Lease) -> bool: ...
    def write_lease(self, lease: Lease) -> None: ...  # blocking: called in a worker thread
    def remove_lease(self, lease: Lease) -> None: ...


def rocm_visible_devices(lease: Lease, amd: set[int], by_index: Mapping[int, Any]) -> dict[str, str]:
    """ROCR_VISIBLE_DEVICES for a lease's AMD GPUs: their GPU-<unique_id> names, else their
    ordinals among the host's AMD GPUs (ROCr's own numbering, in KFD node order). ROCr
    applies it first and renumbers what is left from 0, and HIP then indexes that with
    HIP_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES: so neither is set to the same list (it
    would select nothing). NVIDIA GPUs of a mixed lease keep CUDA_VISIBLE_DEVICES."""
    placements = lease.decision.placements
    amd_order = sorted(index for index, gpu in by_index.items() if getattr(gpu, "amd", None) is not None)
    names = {p.index: uuid for p, uuid in zip(placements, lease.gpu_uuids) if uuid}
    ours = [p.index for p in placements if p.index in amd]
    visible = ([names[i] for i in ours] if all(i in names for i in ours)
               else [str(amd_order.index(i)) for i in ours])
    env = {"ROCR_VISIBLE_DEVICES": ",".join(visible)}
    nvidia = [p for p in placements if p.index not in amd]
    if nvidia:
        uuids = [names.get(p.index) for p in nvidia]
        listed = [u for u in uuids if u] if all(uuids) else [str(p.index) for p in nvidia]
        env.update({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(listed)})
    return env


class EnvironmentBuilder:
    """Builds lease environments, keeping each decision's part (a decision's environment,
    per its GPU uuids and the topology: the engine's memo gives the same decision again)."""

    def __init__(self) -> None:
        self._memo = DecisionMemo()

    def build(self, lease: Lease, topology: Any, by_index: Mapping[int, Any],
              files: LeaseFiles | None) -> dict[str, str]:
        """What a job needs to use its lease: devices, CPUs, memory nodes. All but the
        lease's own id and files follow from its decision on this topology (`by_index`:
        its GPUs by index): built once per decision the engine's memo gives again."""
        env = dict(self._memo.get(lease.decision, (lease.gpu_uuids, topology),
                                  lambda: decision_environment(lease, by_index)))
        env["TOPOD_LEASE"] = lease.id  # in its place: a dict keeps the order of its keys
        if files is not None:
            env.update(files.lease_environment(lease))
        return env


def decision_environment(lease: Lease, by_index: Mapping[int, Any]) -> dict[str, str]:
    """The part of a lease's environment its decision on this topology decides."""
    placements = lease.decision.placements
    if not placements:
        return _cpu_lease_environment(lease)
    amd = {p.index for p in placements if getattr(by_index.get(p.index), "amd", None) is not None}
    if amd:
        env = rocm_visible_devices(lease, amd, by_index)
    else:
        uuids = [u for u in lease.gpu_uuids if u]
        visible = uuids if len(uuids) == len(placements) else [str(p.index) for p in placements]
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(visible)}
    env.update({
        "TOPOD_LEASE": lease.id,
        "TOPOD_GPUS": ",".join(map(str, lease.gpus)),
        "TOPOD_CPUS": format_cpulist(lease.cpus),
        "TOPOD_MEMORY_NODES": ",".join(map(str, lease.memory_nodes)),
        "TOPOD_GPU_CPUS": ";".join(f"{p.index}:{format_cpulist(p.cpus)}" for p in placements),
        "TOPOD_GPU_NODES": ";".join(f"{p.index}:{'' if p.numa_node is None else p.numa_node}"
                                    for p in placements),
    })
    gpu_memory = {p.index: _gpu_memory_node(by_index, p.index, p.address) for p in placements}
    if any(node is not None for node in gpu_memory.values()):
        env["TOPOD_GPU_MEMORY_NODES"] = ";".join(f"{index}:{'' if node is None else node}"
                                                 for index, node in gpu_memory.items())
    env.update(nic_environment(placements))
    return env

def _gpu_memory_node(by_index: Mapping[int, Any], index: int, address: str) -> int | None:
    gpu = by_index.get(index)
    return gpu.memory_numa_node if gpu is not None and gpu.address == address else None


def _cpu_lease_environment(lease: Lease) -> dict[str, str]:
    """A lease without GPUs: its CPUs and memory nodes, and CUDA_VISIBLE_DEVICES set empty,
    which hides every GPU from CUDA (unset would show them all: the job holds none)."""
    return {
        "CUDA_VISIBLE_DEVICES": "",
        "TOPOD_LEASE": lease.id,
        "TOPOD_GPUS": "",
        "TOPOD_CPUS": format_cpulist(lease.cpus),
        "TOPOD_MEMORY_NODES": ",".join(map(str, lease.memory_nodes)),
    }
