"""The housekeeping cores (pure): the first whole cores of each NUMA node, every
hyper-thread of them, kept out of leases so the kernel's IRQs, its per-CPU threads and the
host's own daemons have somewhere to run that no job was promised. On a fresh host they
all sit on CPU 0; kubelet's reserved CPUs and tuned's profiles keep such a core too.

The first cores in CPU order that are neither isolated nor nohz_full (those already serve
no housekeeping); a node never gives up its last core, so a one-core node still leases.
The IRQ planner may place interrupts on them: they are reserved from leases, not from
the host.
"""

from __future__ import annotations

from topod.model import Topology


def housekeeping_cpus(topology: Topology, cores_per_node: int) -> frozenset[int]:
    """Every CPU of the first `cores_per_node` whole cores of each node (0: none)."""
    if cores_per_node <= 0:
        return frozenset()
    kept: set[int] = set()
    for node in topology.numa_nodes:
        cores = _node_cores(topology, node.cpus)
        for core in cores[: min(cores_per_node, len(cores) - 1)]:
            kept.update(core)
    return frozenset(kept)


def _node_cores(topology: Topology, node_cpus: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The node's cores in CPU order, each once, without isolated or nohz_full ones."""
    cores: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for cpu_id in sorted(node_cpus):
        if cpu_id in seen:
            continue
        cpu = topology.cpu(cpu_id)
        core = tuple(sorted(cpu.physical_core)) if cpu is not None else (cpu_id,)
        seen.update(core)
        if cpu is not None and any(_set_apart(topology, c) for c in core):
            continue
        cores.append(core)
    return cores


def _set_apart(topology: Topology, cpu_id: int) -> bool:
    cpu = topology.cpu(cpu_id)
    return cpu is not None and (cpu.isolated or cpu.nohz_full)
