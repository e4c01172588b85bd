"""The PCI tree from the functions sysfs lists (topod.discover.pci): each function's
kind, its switch and bridge hops, and its NUMA locality, as PciDevices. Its own module:
this is the judging half of PCI discovery, on values alone, where topod.discover.pci
is the half that reads the host."""

from __future__ import annotations

from topod.discover.notes import Notes
from topod.discover.pci import RawFunction
from topod.model import NumaNode, PciDevice
from topod.record import record

NVIDIA = 0x10DE
AMD_ATI = 0x1002


def classify(vendor: int | None, class_code: int | None, has_infiniband: bool) -> str:
    """The kind of a PCI function from its vendor and 24-bit class (and RDMA children)."""
    if class_code is None:
        return "rdma" if has_infiniband else "other"
    base, sub = class_code >> 16, (class_code >> 8) & 0xFF
    if has_infiniband or (base, sub) == (0x02, 0x07):
        return "rdma"
    if vendor == NVIDIA and (base, sub) == (0x06, 0x80):
        return "nvswitch"
    if base == 0x03 and vendor == NVIDIA:
        return "gpu"
    if base == 0x03 and sub == 0x80:  # 3D controllers of AMD, Intel and others
        return "gpu"
    if base == 0x03 and vendor == AMD_ATI:
        return "gpu"
    if base == 0x12:  # processing accelerators
        return "gpu"
    if base == 0x02:
        return "nic"
    if class_code == 0x010802:
        return "nvme"
    if base == 0x01:  # other mass-storage controllers: virtio-blk, AHCI, SAS, RAID
        return "storage"
    if base == 0x06:
        return "bridge"
    return "other"


def switch_upstream_ports(functions: list[RawFunction]) -> set[str]:
    """Bridges that are the upstream port of a PCIe switch (or of a device's own bridge
    pair): a bridge below a bridge that is not itself a switch's downstream port, with at
    least one bridge below it. A downstream port with a bridge below it (the next switch,
    or a device's own bridge pair) is the same hop as its switch, never a switch itself."""
    parent_of = {f.address: (f.ancestors[-1] if f.ancestors else None) for f in functions}
    bridges = {f.address for f in functions if _is_pci_bridge(f)}
    has_bridge_child = {parent_of[a] for a in bridges if parent_of[a] is not None}
    ports: set[str] = set()
    # Parents before children: whether a bridge's parent is an upstream port is known.
    for f in sorted((f for f in functions if f.address in bridges), key=lambda f: len(f.ancestors)):
        parent = parent_of[f.address]
        if parent is None or parent not in bridges or parent in ports:
            continue  # a root port, or a switch's downstream port
        if f.address in has_bridge_child:
            ports.add(f.address)
    return ports


def device_bridge_ports(functions: list[RawFunction], upstream_ports: set[str]) -> set[str]:
    """Upstream ports that are a device's own bridge pair, not a switch: one downstream
    port, below which sit only the functions of one device (one bus and slot), as on
    MI300-class GPUs (1002:14a0 -> 1002:14a1 -> the GPU). They are a hop of the path
    (nvidia-smi counts their bridges) but name no PCIe switch."""
    children: dict[str, list[RawFunction]] = {}
    for f in functions:
        if f.ancestors:
            children.setdefault(f.ancestors[-1], []).append(f)
    own: set[str] = set()
    for port in upstream_ports:
        below = children.get(port, [])
        if len(below) != 1 or not _is_pci_bridge(below[0]):
            continue
        leaves = children.get(below[0].address, [])
        slots = {leaf.address.rsplit(".", 1)[0] for leaf in leaves}
        if leaves and len(slots) == 1 and not any(_is_pci_bridge(leaf) for leaf in leaves):
            own.add(port)
    return own


def _is_pci_bridge(f: RawFunction) -> bool:
    return f.class_code is not None and (f.class_code >> 8) == 0x0604


def collapse_chain(ancestors: list[str], upstream_ports: set[str]) -> list[str]:
    """Ancestors with each switch (upstream port + its downstream port) as one hop."""
    hops: list[str] = []
    for index, address in enumerate(ancestors):
        parent = ancestors[index - 1] if index else None
        if parent is not None and parent in upstream_ports:
            continue  # a downstream port: same hop as its switch
        hops.append(address)
    return hops


@record(frozen=False)
class Locality:
    numa_node: int | None
    source: str
    local_cpus: list[int]


def resolve_locality(
    function: RawFunction,
    ancestor_locality: Locality | None,
    nodes: list[NumaNode],
    online: set[int],
    notes: Notes,
) -> Locality:
    """NUMA node and local CPUs like hwloc: firmware numa_node, then local_cpus, then the
    nearest ancestor. Every guess is noted; nothing is invented."""
    path = f"{function.sysfs_path}/numa_node"
    node_ids = {node.id for node in nodes}
    local = sorted(set(function.local_cpus) & online) if function.local_cpus is not None else None
    if local is None and ancestor_locality is not None:
        local = ancestor_locality.local_cpus
    raw = function.numa_node_raw
    if raw is not None and raw >= 0:
        if raw in node_ids:
            cpus = local if local else list(_node(nodes, raw).cpus)
            return Locality(raw, "firmware", cpus)
        notes.add("bad_value", path, f"numa_node {raw} names no NUMA node; ignored")
    if local:
        covering = [node.id for node in nodes if node.cpus and set(node.cpus) & set(local)]
        if len(covering) == 1:
            if raw is not None and raw < 0 and len(nodes) > 1:
                notes.add("numa_from_local_cpus", path, f"numa_node={raw}; node {covering[0]} from local_cpus")
            return Locality(covering[0], "local_cpus" if len(nodes) > 1 else "single_node", local)
        if ancestor_locality is not None and ancestor_locality.numa_node is not None:
            notes.add(
                "numa_from_ancestor",
                path,
                f"numa_node={raw} and local_cpus span nodes {covering}; node "
                f"{ancestor_locality.numa_node} from the upstream bridge",
            )
            return Locality(ancestor_locality.numa_node, "ancestor", local)
        notes.add("numa_unknown", path, f"numa_node={raw} and local_cpus span nodes {covering}; node unknown")
        return Locality(None, "unknown", local)
    if ancestor_locality is not None and ancestor_locality.numa_node is not None:
        notes.add("numa_from_ancestor", path, f"no usable locality; node {ancestor_locality.numa_node} from the upstream bridge")
        return Locality(ancestor_locality.numa_node, "ancestor", ancestor_locality.local_cpus)
    if len(nodes) == 1 and nodes[0].cpus:
        return Locality(nodes[0].id, "single_node", list(nodes[0].cpus))
    notes.add("numa_unknown", path, "no numa_node, no local_cpus, no ancestor locality; node unknown")
    return Locality(None, "unknown", [])


def _node(nodes: list[NumaNode], node_id: int) -> NumaNode:
    return next(node for node in nodes if node.id == node_id)


def build_pci_devices(
    functions: list[RawFunction], nodes: list[NumaNode], online: set[int], notes: Notes
) -> list[PciDevice]:
    upstream_ports = switch_upstream_ports(functions)
    switches = upstream_ports - device_bridge_ports(functions, upstream_ports)
    localities: dict[str, Locality] = {}
    devices: list[PciDevice] = []
    # Parents come before children when sorted by path depth.
    for function in sorted(functions, key=lambda f: (len(f.ancestors), f.address)):
        parent = function.ancestors[-1] if function.ancestors else None
        locality = resolve_locality(function, localities.get(parent) if parent else None, nodes, online, notes)
        localities[function.address] = locality
        chain = collapse_chain(function.ancestors, upstream_ports)
        switch = next((a for a in reversed(function.ancestors) if a in switches), None)
        if function.address in switches:
            switch = function.address
        root_port = function.ancestors[0] if function.ancestors else (
            function.address if _is_pci_bridge(function) else None
        )
        devices.append(
            PciDevice(
                address=function.address,
                vendor=function.vendor,
                device=function.device,
                class_code=function.class_code,
                kind=classify(function.vendor, function.class_code, function.has_infiniband),
                driver=function.driver,
                parent=parent,
                root_complex=function.root_complex,
                root_port=root_port,
                switch=switch,
                numa_node_raw=function.numa_node_raw,
                numa_node=locality.numa_node,
                numa_node_source=locality.source,
                local_cpus=tuple(locality.local_cpus),
                link=function.link,
                msi_irqs=tuple(function.msi_irqs),
                names=tuple(function.names),
                bridge_chain=tuple(chain),
                rdma_ports=tuple(function.rdma_ports),
            )
        )
    devices.sort(key=lambda d: d.address)
    return devices
