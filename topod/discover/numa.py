"""NUMA nodes from sys/devices/system/node: online CPUs, SLIT distances, memory."""

from __future__ import annotations

from topod.cpulist import format_cpulist
from topod.discover.cpus import read_cpu_set
from topod.discover.hugepages import read_node_hugepages
from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import NumaNode
from topod.record import replace
from topod.sysnames import MAX_NUMBER_DIGITS, numbered

NODE_DIR = "sys/devices/system/node"


def parse_meminfo_total(text: str) -> int | None:
    """Bytes of 'Node N MemTotal: X kB' (or /proc/meminfo's MemTotal)."""
    start = 0
    while (found := text.find("MemTotal:", start)) >= 0:
        start = found + len("MemTotal:")
        after = text[start:]
        value = after.lstrip()
        if len(value) == len(after):  # no space after the colon: not this one
            continue
        digits = value[: len(value) - len(value.lstrip("0123456789"))]
        if digits and len(digits) <= MAX_NUMBER_DIGITS and value[len(digits):].lstrip().startswith("kB"):
            return int(digits) * 1024
    return None


def parse_distance_row(text: str) -> list[int]:
    """'10 21 21' -> [10, 21, 21]. Raises ValueError on garbage."""
    values = [int(word) for word in text.split()]
    if any(value <= 0 for value in values):
        raise ValueError(f"non-positive SLIT distance in {text!r}")
    return values


def read_numa_nodes(host: HostRoot, online_cpus: set[int], notes: Notes) -> list[NumaNode]:
    ids = sorted(node for name in host.listdir(NODE_DIR) if (node := numbered(name, "node")) is not None)
    nodes: list[NumaNode] = []
    for node_id in ids:
        base = f"{NODE_DIR}/node{node_id}"
        listed = _read_node_cpus(host, base, notes)
        distances = _read_distances(host, base, node_id, ids, notes)
        meminfo = host.read(f"{base}/meminfo")
        memory = parse_meminfo_total(meminfo) if meminfo is not None else None
        if memory is None:
            notes.add("missing_value", f"{base}/meminfo", "no MemTotal; memory size unknown")
        cpus = tuple(cpu for cpu in listed if cpu in online_cpus)
        nodes.append(
            NumaNode(
                id=node_id,
                cpus=cpus,
                distances=distances,
                memory_bytes=memory,
                listed_cpus=tuple(listed),
                local_cpus=cpus,
                hugepages=read_node_hugepages(host, base, notes),
            )
        )
    nodes = without_overlapping_nodes(nodes, notes)
    # A node with CPUs is its own local set (set above); only CPU-less ones look further.
    return [node if node.cpus else replace(node, local_cpus=near_cpus_of_memory_node(node, nodes))
            for node in nodes]


def without_overlapping_nodes(nodes: list[NumaNode], notes: Notes) -> list[NumaNode]:
    """A CPU belongs to one NUMA node. Firmware that lists the same CPUs under several
    nodes (a real machine in hwloc's corpus lists CPUs 0-7 under all of its 8 nodes, each
    also claiming the machine's whole memory) says nothing usable about those nodes: the
    first node (by id) listing a CPU keeps it, and every later node listing any CPU
    already taken is left out with its memory and distances, as hwloc does. Said in the
    warnings; with the overlap in the model, every CPU would count once per node."""
    kept: list[NumaNode] = []
    owner: dict[int, int] = {}
    for node in nodes:
        shared = [cpu for cpu in node.cpus if cpu in owner]
        if shared:
            others = sorted({owner[cpu] for cpu in shared})
            notes.add("numa_cpus_overlap", f"{NODE_DIR}/node{node.id}/cpulist",
                      f"CPUs {format_cpulist(shared)} are also listed by node(s) {', '.join(map(str, others))}: "
                      f"the firmware's NUMA information is inconsistent; node {node.id} ignored (its memory "
                      f"and distances too)")
            continue
        for cpu in node.cpus:
            owner[cpu] = node.id
        kept.append(node)
    if len(kept) == len(nodes):
        return nodes
    ids = {node.id for node in kept}
    return [replace(node, distances={other: value for other, value in node.distances.items() if other in ids})
            for node in kept]


def _read_node_cpus(host: HostRoot, base: str, notes: Notes) -> list[int]:
    """cpulist, else cpumap, else the cpuN links (old kernels have only some of them)."""
    listed = read_cpu_set(host, f"{base}/cpulist", f"{base}/cpumap", notes, instead="used the cpuN entries")
    if listed is not None:
        return listed
    entries = [cpu for name in host.listdir(base)
               if (cpu := numbered(name, "cpu")) is not None and cpu < notes.cpu_limit]
    if not entries and not host.exists(f"{base}/cpumap"):
        notes.add("missing_file", f"{base}/cpulist", "no cpulist, cpumap or cpuN entries; node has no known CPUs")
    return sorted(entries)


def near_cpus_of_memory_node(node: NumaNode, nodes: list[NumaNode]) -> tuple[int, ...]:
    """A CPU-less node is local to the CPU nodes at the smallest SLIT distance (as hwloc
    places memory-only and generic-initiator nodes)."""
    if node.cpus:
        return node.cpus
    candidates = [(node.distances[other.id], other) for other in nodes
                  if other.cpus and other.id in node.distances]
    if not candidates:
        return ()
    nearest = min(distance for distance, _ in candidates)
    return tuple(sorted(cpu for distance, other in candidates if distance == nearest for cpu in other.cpus))


def _read_distances(host: HostRoot, base: str, node_id: int, ids: list[int], notes: Notes) -> dict[int, int]:
    text = host.read(f"{base}/distance")
    if text is None:
        notes.add("missing_file", f"{base}/distance", "no SLIT row; only the local distance is known")
        return {node_id: 10}
    try:
        row = parse_distance_row(text)
    except ValueError as exc:
        notes.add("bad_value", f"{base}/distance", f"{exc}; only the local distance is kept")
        return {node_id: 10}
    # The row is indexed by the position of each *possible* node, which for sparse ids is
    # the order of the node directories.
    if len(row) != len(ids):
        notes.add(
            "bad_value",
            f"{base}/distance",
            f"{len(row)} distances for {len(ids)} nodes; kept the first {min(len(row), len(ids))}",
        )
    return {other: value for other, value in zip(ids, row)}


def nodes_from_cpus_without_sysfs(online_cpus: set[int], notes: Notes) -> list[NumaNode]:
    """A kernel built without NUMA has no node directory: that is one node, said so."""
    notes.add(
        "no_numa_sysfs",
        NODE_DIR,
        "no NUMA node directories; the host is treated as one node 0 holding every online CPU",
    )
    cpus = tuple(sorted(online_cpus))
    return [NumaNode(id=0, cpus=cpus, distances={0: 10}, memory_bytes=None, local_cpus=cpus)]
