"""Memory-only NUMA nodes of a host spec: CXL expanders, GPU memory (Grace), with HMAT
initiators and performance and memory tiers, at any (sparse) node id.

    [[memory_node]]
    id = 2                  # any id above the CPU nodes; gaps are kept
    home = 0                # the CPU node it hangs off
    memory_gib = 256        # 0 for an empty placeholder node (Grace MIG nodes)
    distance = 20           # SLIT to home (others: + the home's SLIT - 10)
    slit = { "1" = 26 }     # optional per-node SLIT overrides
    gpu = 0                 # optional: the GPU whose memory this is (nvml.json)
    hmat = [0, 1]           # optional: access classes written (initiators = home)
    initiators = [0]        # optional: other initiators than home
    read_bandwidth = 65536  # optional HMAT figures (MB/s, ns)
    tier = 22               # optional memory_tierN

    [memory_tiers]
    cpu_nodes = 4           # memory_tierN of the CPU nodes
"""

from __future__ import annotations

from topod.cpulist import format_cpulist
from topod.hostspec.cpus import CpuLayout

NODE_BASE = "sys/devices/system/node"
TIER_BASE = "sys/devices/virtual/memory_tiering"
PERF = ("read_bandwidth", "write_bandwidth", "read_latency", "write_latency")


def memory_node_specs(spec: dict) -> list[dict]:
    return list(spec.get("memory_node", []))


def write_memory_nodes(write, spec: dict, layout: CpuLayout) -> None:
    """Add the spec's memory nodes to the node tree written by write_cpu_tree (which wrote
    the CPU nodes 0..n-1): their directories, every node's SLIT row over all ids, node
    online/possible/has_cpu/has_memory, HMAT access classes and memory tiers."""
    extras = memory_node_specs(spec)
    cpu_nodes = list(range(layout.node_count))
    if not extras and "memory_tiers" not in spec:
        return
    ids = sorted(cpu_nodes + [int(m["id"]) for m in extras])
    by_id = {int(m["id"]): m for m in extras}
    for node in ids:
        row = [_slit(node, other, layout, by_id) for other in ids]
        write(f"{NODE_BASE}/node{node}/distance", " ".join(str(v) for v in row) + "\n")
    for node_id, m in by_id.items():
        ndir = f"{NODE_BASE}/node{node_id}"
        kib = int(m.get("memory_gib", 0)) * 1024 * 1024
        write(f"{ndir}/cpulist", "\n")
        write(f"{ndir}/meminfo", f"Node {node_id} MemTotal:       {kib} kB\nNode {node_id} MemFree:        {kib} kB\n")
        initiators = [int(i) for i in m.get("initiators", [m["home"]])]
        for access in m.get("hmat", []):
            base = f"{ndir}/access{int(access)}/initiators"
            for initiator in initiators:
                write.link(f"{base}/node{initiator}", f"../../../node{initiator}")  # as sysfs links them
            for name in PERF:
                if name in m:
                    write(f"{base}/{name}", f"{int(m[name])}\n")
    write(f"{NODE_BASE}/online", format_cpulist(ids) + "\n")
    write(f"{NODE_BASE}/possible", format_cpulist(ids) + "\n")
    write(f"{NODE_BASE}/has_cpu", format_cpulist(cpu_nodes) + "\n")
    write(f"{NODE_BASE}/has_memory", format_cpulist(
        [n for n in ids if n in cpu_nodes or int(by_id[n].get("memory_gib", 0)) > 0]) + "\n")
    _write_tiers(write, spec, cpu_nodes, by_id)


def _slit(a: int, b: int, layout: CpuLayout, by_id: dict[int, dict]) -> int:
    if a == b:
        return 10
    if a not in by_id and b not in by_id:
        return layout.distances[a][b]
    if a in by_id and str(b) in by_id[a].get("slit", {}):
        return int(by_id[a]["slit"][str(b)])
    if b in by_id and str(a) in by_id[b].get("slit", {}):
        return int(by_id[b]["slit"][str(a)])
    home_a = int(by_id[a]["home"]) if a in by_id else a
    home_b = int(by_id[b]["home"]) if b in by_id else b
    reach = max(int(by_id[n].get("distance", 20)) for n in (a, b) if n in by_id)
    between = layout.distances[home_a][home_b] - 10 if home_a != home_b else 0
    return reach + between


def _write_tiers(write, spec: dict, cpu_nodes: list[int], by_id: dict[int, dict]) -> None:
    tiers: dict[int, list[int]] = {}
    cpu_tier = spec.get("memory_tiers", {}).get("cpu_nodes")
    if cpu_tier is not None:
        tiers.setdefault(int(cpu_tier), []).extend(cpu_nodes)
    for node_id, m in by_id.items():
        if "tier" in m:
            tiers.setdefault(int(m["tier"]), []).append(node_id)
    for tier, nodes in tiers.items():
        write(f"{TIER_BASE}/memory_tier{tier}/nodelist", format_cpulist(sorted(nodes)) + "\n")


def gpu_memory_nodes(spec: dict) -> dict[int, int]:
    """GPU index -> memory node id, as the spec's nvml.json states it."""
    return {int(m["gpu"]): int(m["id"]) for m in memory_node_specs(spec) if "gpu" in m}
