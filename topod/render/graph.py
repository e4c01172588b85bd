"""The host as a graph: NUMA nodes with their cores, root complexes, PCIe switches,
GPUs, NICs, NVMe, NVLink and NVSwitch, optionally leases (by owner) and IRQ placement.

Pure: a Topology (plus plain lease/IRQ-plan values) in, a HostGraph out. dot.py turns it
into Graphviz; tests read its structure directly. PCI bridges that are only root or
downstream ports are folded into the edge they sit on, as `nvidia-smi topo` and lstopo do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from topod.cpulist import format_cpulist
from topod.model import Cpu, PciDevice, Topology

ENDPOINT_KINDS = ("gpu", "nvswitch", "rdma", "nic", "nvme", "storage", "other")
# Owner colours: distinct at a glance, none of them the green of an unleased GPU.
OWNER_COLOURS = ("#ef9a9a", "#90caf9", "#ce93d8", "#ffcc80", "#80deea", "#f48fb1", "#bcaaa4", "#fff59d")
UNKNOWN_NODE = "unknown"


@dataclass(frozen=True, slots=True)
class GraphNode:
    id: str
    kind: str  # numa | cores | root_complex | switch | fabric | one of ENDPOINT_KINDS
    label: str
    cluster: str | None  # NUMA cluster id, None for host-wide nodes (the NVSwitch fabric)
    owner: str | None = None  # lease owner, for colouring
    degraded: bool = False  # a PCIe link trained below its maximum
    cpus: tuple[int, ...] = ()  # for core groups: the CPUs in the box


@dataclass(frozen=True, slots=True)
class GraphEdge:
    tail: str
    head: str
    kind: str  # numa | pci | nvlink | nvswitch (GPU -> fabric) | nvswitch_chip (fabric -> chip) | irq
    label: str = ""
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class Cluster:
    id: str
    label: str


@dataclass(frozen=True, slots=True)
class LeaseView:
    id: str
    owner: str
    gpus: tuple[int, ...]
    cpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HostGraph:
    title: str
    clusters: tuple[Cluster, ...]
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    owner_colours: tuple[tuple[str, str], ...] = ()  # (owner, colour), in legend order

    def node(self, node_id: str) -> GraphNode | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def of_kind(self, *kinds: str) -> list[GraphNode]:
        return [n for n in self.nodes if n.kind in kinds]

    def edges_of(self, *kinds: str) -> list[GraphEdge]:
        return [e for e in self.edges if e.kind in kinds]

    def colour_of(self, owner: str | None) -> str | None:
        return dict(self.owner_colours).get(owner) if owner else None


def device_id(address: str) -> str:
    return f"pci:{address}"


def gpu_node_id(topology: Topology, index: int) -> str:
    gpu = topology.gpu(index)
    return device_id(gpu.address) if gpu else f"gpu:{index}"


def lease_views(leases: Iterable[object] | None) -> tuple[LeaseView, ...]:
    """Leases as dicts {id, owner, gpus, cpus, ...} or objects with those attributes."""
    views = []
    for item in leases or ():
        get = item.get if isinstance(item, Mapping) else (lambda key, default=None, o=item: getattr(o, key, default))
        lease_id = get("id")
        if lease_id is None:
            raise ValueError(f"a lease needs an 'id': {item!r}")
        gpus = tuple(int(g) for g in get("gpus", ()) or ())
        cpus = tuple(int(c) for c in get("cpus", ()) or ())
        views.append(LeaseView(str(lease_id), str(get("owner") or lease_id), gpus, cpus))
    return tuple(views)


def build_graph(topology: Topology, leases: Iterable[object] | None = None,
                irq_plan: Mapping[object, Iterable[int]] | None = None,
                irq_current: Mapping[object, Iterable[int]] | None = None) -> HostGraph:
    """irq_current: where each vector is delivered now (effective affinity); drawn as
    edges and labelled "IRQs on". irq_plan: where topod's plan puts them; labelled
    "planned" (edges too when nothing says where they are now), never passed off as now."""
    views = lease_views(leases)
    owners = sorted({v.owner for v in views})
    colours = tuple((owner, OWNER_COLOURS[i % len(OWNER_COLOURS)]) for i, owner in enumerate(owners))
    nodes: list[GraphNode] = []
    edges: list[GraphEdge] = []
    clusters = _numa_clusters(topology, nodes, edges, views)
    _pci_tree(topology, nodes, edges, views, clusters)
    _nvlink(topology, nodes, edges)
    if irq_plan or irq_current:
        _irq_edges(topology, nodes, edges, irq_current or irq_plan or {}, irq_plan if irq_current else None,
                   drawn_is_plan=not irq_current)
    title = (f"{topology.root}: {len(topology.numa_nodes)} NUMA node(s), {len(topology.online_cpus)} CPUs, "
             f"{len(topology.gpus)} GPU(s)")
    return HostGraph(title, tuple(clusters), tuple(nodes), tuple(edges), colours)


def cluster_id(node: int | None) -> str:
    return f"numa{node}" if node is not None else UNKNOWN_NODE


def _numa_clusters(topology: Topology, nodes: list[GraphNode], edges: list[GraphEdge],
                   leases: tuple[LeaseView, ...]) -> list[Cluster]:
    clusters = []
    for numa in topology.numa_nodes:
        cid = cluster_id(numa.id)
        memory = f"{numa.memory_bytes / 2**30:.0f} GiB" if numa.memory_bytes else "memory ?"
        kind = "memory only" if not numa.has_cpus else f"CPUs {format_cpulist(numa.cpus)}"
        clusters.append(Cluster(cid, f"NUMA node {numa.id}"))
        nodes.append(GraphNode(cid, "numa", f"NUMA node {numa.id}\n{memory}\n{kind}", cid))
        for group_id, label, owner, cpus in core_groups(topology, numa.id, leases):
            nodes.append(GraphNode(group_id, "cores", label, cid, owner, cpus=cpus))
            edges.append(GraphEdge(cid, group_id, "numa"))
    if any(d.numa_node is None for d in topology.pci_devices if d.kind in ENDPOINT_KINDS):
        clusters.append(Cluster(UNKNOWN_NODE, "NUMA node unknown"))
    return clusters


def core_groups(topology: Topology, node: int,
                leases: tuple[LeaseView, ...]) -> list[tuple[str, str, str | None, tuple[int, ...]]]:
    """(id, label, owner, cpus) per run of physical cores on a node sharing an LLC, an owner and
    isolation: one box per socket when nothing is leased, one per lease when leases are."""
    cores: dict[tuple[int, ...], list[Cpu]] = {}
    for cpu in topology.cpus:
        if cpu.online and cpu.numa_node == node:
            cores.setdefault(cpu.physical_core, []).append(cpu)
    owner_of = {c: lease.owner for lease in leases for c in lease.cpus}
    lease_of = {c: lease.id for lease in leases for c in lease.cpus}
    runs: list[tuple[tuple[object, ...], list[list[Cpu]]]] = []
    for key_cpus in sorted(cores, key=lambda k: k[0]):
        members = cores[key_cpus]
        owner = next((owner_of[c.id] for c in members if c.id in owner_of), None)
        lease = next((lease_of[c.id] for c in members if c.id in lease_of), None)
        key = (members[0].llc, owner, lease, any(c.isolated for c in members))
        if runs and runs[-1][0] == key:
            runs[-1][1].append(members)
        else:
            runs.append((key, [members]))
    groups = []
    for number, ((_, owner, lease, isolated), run) in enumerate(runs):
        cpus = [c.id for core in run for c in core]
        firsts = [core[0].id for core in run]
        label = f"{len(run)} core(s), {len(cpus)} CPUs\nCPUs {format_cpulist(cpus)}"
        if isolated:
            label += "\nisolated"
        if lease:
            label += f"\nlease {lease} ({owner})"
        groups.append((f"cores{node}_{number}_{firsts[0]}", label, owner, tuple(sorted(cpus))))
    return groups


def _switch_ports(topology: Topology) -> set[str]:
    return {d.switch for d in topology.pci_devices if d.switch}


def graph_parent(topology: Topology, device: PciDevice, switches: set[str]) -> str:
    """The nearest switch (by its upstream port) above a device, else its root complex."""
    parent = device.parent
    seen = set()
    while parent and parent not in seen:
        seen.add(parent)
        if parent in switches and parent != device.address:
            return device_id(parent)
        above = topology.device(parent)
        parent = above.parent if above else None
    return f"rc:{device.root_complex}"


def _pci_tree(topology: Topology, nodes: list[GraphNode], edges: list[GraphEdge],
              leases: tuple[LeaseView, ...], clusters: list[Cluster]) -> None:
    switches = _switch_ports(topology)
    gpu_of = {gpu.address: gpu for gpu in topology.gpus}
    lease_of_gpu = {g: lease for lease in leases for g in lease.gpus}
    complexes: dict[str, int | None] = {}
    for device in topology.pci_devices:
        if device.kind in ENDPOINT_KINDS or device.address in switches:
            complexes.setdefault(device.root_complex, device.numa_node)
    for rc, numa in sorted(complexes.items()):
        cid = cluster_id(numa)
        nodes.append(GraphNode(f"rc:{rc}", "root_complex", f"root complex\n{rc or 'unknown'}", cid))
        if numa is not None:
            edges.append(GraphEdge(cid, f"rc:{rc}", "numa"))
    for device in topology.pci_devices:
        is_switch = device.address in switches
        if device.kind not in ENDPOINT_KINDS and not is_switch:
            continue
        cid = cluster_id(device.numa_node)
        owner = None
        if is_switch:
            kind, label = "switch", f"PCIe switch\n{device.address}"
        elif device.address in gpu_of:
            gpu = gpu_of[device.address]
            kind = "gpu"
            label = f"GPU{gpu.index} {_short_name(gpu.name)}\n{device.address}"
            lease = lease_of_gpu.get(gpu.index)
            if lease:
                owner = lease.owner
                label += f"\nlease {lease.id} ({lease.owner})"
            elif leases:
                label += "\nfree"
        else:
            kind = device.kind
            label = f"{_kind_title(device)}\n{device.address}"
        degraded = bool(device.link and device.link.degraded)
        link = _link_text(device)
        if degraded:
            label += f"\nlink {link}"
        nodes.append(GraphNode(device_id(device.address), kind, label, cid, owner, degraded))
        edges.append(GraphEdge(graph_parent(topology, device, switches), device_id(device.address), "pci",
                               link if degraded else "", degraded))


def _short_name(name: str | None) -> str:
    if not name:
        return ""
    return name.replace("NVIDIA ", "").replace("Tesla ", "")


def _kind_title(device: PciDevice) -> str:
    names = " / ".join(device.names) if device.names else ""
    title = {"rdma": "RDMA NIC", "nic": "NIC", "nvme": "NVMe", "storage": "Storage", "nvswitch": "NVSwitch", "other": "PCI device"}
    head = title.get(device.kind, device.kind)
    return f"{head} {names}".strip()


def _link_text(device: PciDevice) -> str:
    link = device.link
    if link is None:
        return ""
    current = f"{(link.current_speed or '?').split()[0]} GT/s x{link.current_width or '?'}"
    maximum = f"{(link.max_speed or '?').split()[0]} GT/s x{link.max_width or '?'}"
    return current if current == maximum else f"{current} of {maximum}"


def _nvlink(topology: Topology, nodes: list[GraphNode], edges: list[GraphEdge]) -> None:
    fabric = topology.nvlink
    for (a, b), links in sorted(fabric.pairs.items()):
        edges.append(GraphEdge(gpu_node_id(topology, a), gpu_node_id(topology, b), "nvlink", f"NV{links}"))
    known = {d.address for d in topology.pci_devices}
    for number, island in enumerate(fabric.islands):
        fabric_id = f"fabric:{number}"
        switches = sorted({link.remote_pci_bus_id.lower()[-12:] for g in island if (gpu := topology.gpu(g))
                           for link in gpu.nvlinks if link.remote_device_type == "switch"})
        label = (f"NVSwitch fabric\nGPUs {format_cpulist(island)}, all-to-all"
                 + (f"\n{len(switches)} NVSwitch chip(s)" if switches else ""))
        nodes.append(GraphNode(fabric_id, "fabric", label, None))
        for gpu in island:
            links = fabric.island_links.get(gpu, 0)
            edges.append(GraphEdge(gpu_node_id(topology, gpu), fabric_id, "nvswitch", f"NV{links}" if links else ""))
        for address in switches:
            if address in known:
                edges.append(GraphEdge(fabric_id, device_id(address), "nvswitch_chip"))


def _irq_placement(placement: Mapping[object, Iterable[int]]) -> dict[int, set[int]]:
    return {int(str(irq)): {int(c) for c in cpus} for irq, cpus in placement.items()}


def _irq_edges(topology: Topology, nodes: list[GraphNode], edges: list[GraphEdge],
               drawn: Mapping[object, Iterable[int]], also_planned: Mapping[object, Iterable[int]] | None,
               drawn_is_plan: bool) -> None:
    """Device -> core group edges, labelled with how many of its vectors `drawn` puts
    there; the device's label says the CPUs ("IRQs on" now, or "IRQs planned" when
    `drawn` is the plan), the plan's CPUs too where they differ from now, and the group's
    label who interrupts it."""
    plan = _irq_placement(drawn)
    other = _irq_placement(also_planned or {})
    groups = [(n.id, set(n.cpus)) for n in nodes if n.kind == "cores"]
    index = {n.id: i for i, n in enumerate(nodes)}
    sources: dict[str, list[str]] = {}
    for device in topology.pci_devices:
        node_id = device_id(device.address)
        planned = [plan[irq] for irq in device.msi_irqs if irq in plan]
        if node_id not in index or not planned:
            continue
        counts: dict[str, int] = {}
        for cpus in planned:
            for group_id, members in groups:
                if cpus & members:
                    counts[group_id] = counts.get(group_id, 0) + 1
        for group_id, count in sorted(counts.items()):
            edges.append(GraphEdge(node_id, group_id, "irq", f"{count} IRQ"))
            sources.setdefault(group_id, []).append(_short_device(device))
        cpus = sorted(set().union(*planned))
        node = nodes[index[node_id]]
        label = f"{node.label}\nIRQs {'planned' if drawn_is_plan else 'on'} → {_cpus_noun(cpus)}"
        later = [other[irq] for irq in device.msi_irqs if irq in other]
        if later and set().union(*later) != set(cpus):
            label += f"\nplanned → {_cpus_noun(sorted(set().union(*later)))}"
        nodes[index[node_id]] = replace(node, label=label)
    for group_id, names in sources.items():
        node = nodes[index[group_id]]
        shown = ", ".join(names[:4]) + (f" +{len(names) - 4}" if len(names) > 4 else "")
        nodes[index[group_id]] = replace(node, label=f"{node.label}\nIRQs of {shown}")


def _cpus_noun(cpus: list[int]) -> str:
    return f"{'CPU' if len(cpus) == 1 else 'CPUs'} {format_cpulist(cpus)}"


def _short_device(device: PciDevice) -> str:
    for prefix in ("mlx5_", "nvme", ""):
        for name in device.names:
            if name.startswith(prefix):
                return name
    return device.address
