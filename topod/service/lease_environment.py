"""A lease's environment (a mixin of topod.service.leases.LeaseService): the variables a
job runs its lease with (devices, CPUs, memory nodes, NICs, the lease's id and files). Its
own module because the environment is what a lease promises the job, apart from how the
grant is decided: the grant fills it in once, and clients (topoctl bind) read it back.
"""

from __future__ import annotations

from topod.alloc.nics import nic_environment
from topod.cpulist import format_cpulist
from topod.service.lease import Lease


class LeaseEnvironment:
    def environment(self, lease: Lease) -> dict[str, str]:
        """What a job needs to use its lease: devices, CPUs, memory nodes. All but the
        lease's own id and files follow from its decision on this topology: built once
        per decision the engine's memo gives again."""
        env = dict(self._environments.get(lease.decision, (lease.gpu_uuids, self.topology),
                                          lambda: self._decision_environment(lease)))
        env["TOPOD_LEASE"] = lease.id  # in its place: a dict keeps the order of its keys
        if self.files is not None:
            env.update(self.files.lease_environment(lease))
        return env

    def _decision_environment(self, lease: Lease) -> dict[str, str]:
        placements = lease.decision.placements
        uuids = [u for u in lease.gpu_uuids if u]
        visible = uuids if len(uuids) == len(placements) else [str(p.index) for p in placements]
        env = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(visible),
            "TOPOD_LEASE": lease.id,
            "TOPOD_GPUS": ",".join(map(str, lease.gpus)),
            "TOPOD_CPUS": format_cpulist(lease.cpus),
            "TOPOD_MEMORY_NODES": ",".join(map(str, lease.memory_nodes)),
            "TOPOD_GPU_CPUS": ";".join(f"{p.index}:{format_cpulist(p.cpus)}" for p in placements),
            "TOPOD_GPU_NODES": ";".join(f"{p.index}:{'' if p.numa_node is None else p.numa_node}"
                                        for p in placements),
        }
        gpu_memory = {p.index: self._gpu_memory_node(p.index, p.address) for p in placements}
        if any(node is not None for node in gpu_memory.values()):
            env["TOPOD_GPU_MEMORY_NODES"] = ";".join(f"{index}:{'' if node is None else node}"
                                                     for index, node in gpu_memory.items())
        env.update(nic_environment(placements))
        return env

    def _gpu_memory_node(self, index: int, address: str) -> int | None:
        gpu = self._gpus_by_index().get(index)
        return gpu.memory_numa_node if gpu is not None and gpu.address == address else None
