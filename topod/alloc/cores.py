"""Cores for a GPU set: whole physical cores on each GPU's node, never isolated, nohz_full,
leased or reserved CPUs, kept together and sharing the GPU's L3 where possible."""

from __future__ import annotations

from topod.alloc.request import FreeState, Request, allocation_error
from topod.model import Gpu, Topology


def _usable_cores(topology: Topology, node: int | None, taken: set[int]) -> list[tuple[int, ...]]:
    cores: dict[tuple[int, ...], None] = {}
    for cpu in topology.cpus:
        if not cpu.online or cpu.numa_node != node:
            continue
        core = tuple(c for c in cpu.physical_core)
        if any(c in taken for c in core):
            continue
        if any((topology.cpu(c) is not None and (topology.cpu(c).isolated or topology.cpu(c).nohz_full))
               for c in core):
            continue
        cores[core] = None
    return sorted(cores, key=lambda core: (_llc(topology, core), core[0]))


def _llc(topology: Topology, core: tuple[int, ...]) -> int:
    cpu = topology.cpu(core[0])
    return cpu.llc if cpu is not None and cpu.llc is not None else -1


def pick_cores(topology: Topology, gpus: list[Gpu], request: Request,
               state: FreeState) -> tuple[dict[int, tuple[list[int], int | None]], list[str]]:
    """gpu index -> (CPUs, node they are on); reasons for anything unusual."""
    result: dict[int, tuple[list[int], int | None]] = {}
    reasons: list[str] = []
    if request.cpus_per_gpu == 0:
        return {g.index: ([], g.numa_node) for g in gpus}, reasons
    taken = set(state.busy_cpus) | set(state.reserved_cpus)
    for gpu in gpus:
        node = gpu.numa_node
        picked, where = _take(topology, node, request.cpus_per_gpu, taken)
        if picked is None:
            if request.level != "any":
                raise allocation_error(
                    "insufficient_cpus",
                    f"GPU {gpu.index}: fewer than {request.cpus_per_gpu} free whole-core CPUs on node {node}")
            picked, where = _fallback(topology, node, request.cpus_per_gpu, taken)
            if picked is None:
                raise allocation_error("insufficient_cpus", f"GPU {gpu.index}: no node has "
                                                            f"{request.cpus_per_gpu} free CPUs")
            reasons.append(f"GPU {gpu.index}: CPUs from node {where} (node {node} full; level 'any' fallback)")
        taken.update(picked)
        result[gpu.index] = (sorted(picked), where)
    if any(len(cpus) > request.cpus_per_gpu for cpus, _ in result.values()):
        reasons.append(f"cpus_per_gpu={request.cpus_per_gpu} rounded up to whole physical cores")
    return result, reasons


def _take(topology: Topology, node: int | None, count: int, taken: set[int]):
    if node is None:
        return None, None
    picked: list[int] = []
    for core in _usable_cores(topology, node, taken):
        if len(picked) >= count:
            break
        picked.extend(core)
    return (picked, node) if len(picked) >= count else (None, None)


def _fallback(topology: Topology, node: int | None, count: int, taken: set[int]):
    home = topology.node(node) if node is not None else None
    order = sorted((n for n in topology.numa_nodes if n.has_cpus and n.id != node),
                   key=lambda n: (home.distances.get(n.id, 999) if home else 0, n.id))
    for other in order:
        picked, where = _take(topology, other.id, count, taken)
        if picked is not None:
            return picked, where
    return None, None
