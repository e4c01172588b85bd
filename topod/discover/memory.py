"""Memory placement beyond the SLIT: HMAT initiators and performance, memory tiers, and
which NUMA node holds a GPU's memory.

As hwloc does, a node's initiators come from HMAT first (`nodeN/access1/initiators/`:
the best *CPU* initiators; `access0/initiators/`: the best initiators of any kind, a
generic initiator included, and the only class kernels before 5.10 have), and from the
SLIT (the CPU nodes at the smallest distance) when HMAT says nothing usable. The kernel's
ABI (Documentation/ABI/stable/sysfs-devices-node) defines access0 as "any initiator" and
access1 as "CPU initiators"; hwloc's corpus host fakememinitiators agrees (node 5:
access0 -> generic initiator node 4, access1 -> CPU node 0; lstopo places it on node 0).

Parsing functions take text; `apply_memory_facts` takes a HostRoot and the nodes.
"""

from __future__ import annotations

from topod.cpulist import parse_cpulist
from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import Gpu, MemoryAccess, NumaNode
from topod.record import replace
from topod.sysnames import numbered

NODE_DIR = "sys/devices/system/node"
TIER_DIR = "sys/devices/virtual/memory_tiering"
ACCESS_FILES = ("read_bandwidth", "write_bandwidth", "read_latency", "write_latency")
# A GPU memory node found by the sysfs heuristic must hold this share of the GPU's memory,
# up to 100 % plus the slack (firmware carves out a little; nodes round to pages).
GPU_MEMORY_MATCH = (0.85, 1.05)


def parse_access_value(text: str) -> int | None:
    """'131072\\n' -> 131072; None for garbage or a negative number."""
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def parse_initiator_names(names: list[str]) -> list[int]:
    """The nodeN entries of an initiators/ directory -> sorted node ids."""
    return sorted(node for name in names if (node := numbered(name, "node")) is not None)


def parse_tier_nodelist(text: str) -> list[int]:
    """memory_tierN/nodelist ('0-1,4') -> node ids; ValueError on garbage."""
    return parse_cpulist(text.strip()) if text.strip() else []


def read_access(host: HostRoot, node_id: int, access: int) -> tuple[list[int], MemoryAccess | None] | None:
    """Initiator node ids and performance of one access class, None when absent."""
    base = f"{NODE_DIR}/node{node_id}/access{access}/initiators"
    names = host.listdir(base)
    if not names:
        return None
    initiators = parse_initiator_names(names)
    values = {}
    for name in ACCESS_FILES:
        text = host.read(f"{base}/{name}") if name in names else None
        values[name] = parse_access_value(text) if text is not None else None
    perf = MemoryAccess(**values) if any(v is not None for v in values.values()) else None
    return initiators, perf


def read_memory_tiers(host: HostRoot, notes: Notes) -> dict[int, int]:
    """node id -> memory tier number (the N of memory_tierN)."""
    tier_of: dict[int, int] = {}
    for name in host.listdir(TIER_DIR):
        tier = numbered(name, "memory_tier")
        if tier is None:
            continue
        text = host.read(f"{TIER_DIR}/{name}/nodelist")
        if text is None:
            continue
        try:
            nodes = parse_tier_nodelist(text)
        except ValueError:
            notes.add("bad_value", f"{TIER_DIR}/{name}/nodelist", "not a node list; ignored")
            continue
        for node in nodes:
            tier_of.setdefault(node, tier)
    return tier_of


def apply_memory_facts(host: HostRoot, nodes: list[NumaNode], notes: Notes) -> list[NumaNode]:
    """Nodes with initiators, HMAT performance, local CPUs and memory tiers filled in."""
    tiers = read_memory_tiers(host, notes)
    by_id = {node.id: node for node in nodes}
    out = []
    for node in nodes:
        initiators, source, perf = _initiators(host, node, nodes, by_id, notes)
        if node.cpus:
            local = node.cpus
        else:
            local = tuple(sorted({cpu for i in initiators if (n := by_id.get(i)) for cpu in n.cpus}))
        out.append(replace(node, initiators=tuple(initiators), initiator_source=source, access=perf,
                           local_cpus=local, memory_tier=tiers.get(node.id)))
    return out


def _initiators(host: HostRoot, node: NumaNode, nodes: list[NumaNode], by_id: dict[int, NumaNode],
                notes: Notes) -> tuple[list[int], str, MemoryAccess | None]:
    """access1 (CPU initiators), else access0 whose initiators have CPUs, else the SLIT."""
    perf_fallback: MemoryAccess | None = None
    for access in (1, 0):
        found = read_access(host, node.id, access)
        if found is None:
            continue
        initiators, perf = found
        perf_fallback = perf_fallback or perf
        with_cpus = [i for i in initiators if (n := by_id.get(i)) is not None and n.cpus]
        if with_cpus:
            return with_cpus, f"hmat-access{access}", perf
        if initiators and not node.cpus:
            notes.add("hmat_initiators_without_cpus", f"{NODE_DIR}/node{node.id}/access{access}/initiators",
                      f"initiators {initiators} have no online CPUs; tried the next source")
    if node.cpus:
        return [node.id], "cpus", perf_fallback
    slit = slit_initiators(node, nodes)
    return slit, ("slit" if slit else "none"), perf_fallback


def slit_initiators(node: NumaNode, nodes: list[NumaNode]) -> list[int]:
    """The CPU nodes at the smallest SLIT distance from a CPU-less node (hwloc's rule)."""
    candidates = [(node.distances[other.id], other.id) for other in nodes
                  if other.cpus and other.id in node.distances and other.id != node.id]
    if not candidates:
        return []
    nearest = min(distance for distance, _ in candidates)
    return sorted(other for distance, other in candidates if distance == nearest)


def guess_gpu_memory_nodes(gpus: list[Gpu], nodes: list[NumaNode], notes: Notes) -> dict[int, int]:
    """GPU index -> memory node, for GPUs NVML gave none, by this sysfs heuristic:

    a CPU-less node with memory, not claimed by another GPU, whose initiators (HMAT, else
    SLIT nearest) include the GPU's own NUMA node (its PCI function's), and whose
    MemTotal is 85-105 % of the GPU's memory_total. Among several, the nearest by SLIT to
    the GPU's node, then the lowest id. GPUs with unknown memory size or node get none.
    Each guess is a `gpu_memory_node_guessed` warning.
    """
    claimed = {gpu.memory_numa_node for gpu in gpus if gpu.memory_numa_node is not None}
    guesses: dict[int, int] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.memory_numa_node is not None or gpu.memory_total_mib is None or gpu.numa_node is None:
            continue
        want = gpu.memory_total_mib * 1024 * 1024
        fits = []
        for node in nodes:
            if node.cpus or node.id in claimed or not node.memory_bytes:
                continue
            if gpu.numa_node not in node.initiators:
                continue
            if not GPU_MEMORY_MATCH[0] * want <= node.memory_bytes <= GPU_MEMORY_MATCH[1] * want:
                continue
            fits.append((node.distances.get(gpu.numa_node, 255), node.id))
        if not fits:
            continue
        _, chosen = min(fits)
        claimed.add(chosen)
        guesses[gpu.index] = chosen
        notes.add("gpu_memory_node_guessed", f"{NODE_DIR}/node{chosen}",
                  f"GPU {gpu.index}: NVML gave no memory NUMA node; node {chosen} is CPU-less, near node "
                  f"{gpu.numa_node} and holds {_pct(nodes, chosen, want)} % of the GPU's memory")
    return guesses


def _pct(nodes: list[NumaNode], node_id: int, want: int) -> int:
    node = next(n for n in nodes if n.id == node_id)
    return round(100 * (node.memory_bytes or 0) / want)
