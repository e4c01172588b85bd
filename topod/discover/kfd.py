"""AMD GPUs from amdgpu's KFD topology (/sys/class/kfd/kfd/topology) and the amdgpu
attributes on each GPU's PCI function.

The KFD ABI (linux drivers/gpu/drm/amd/amdkfd/kfd_topology.c): nodes/N/{gpu_id,name,
properties,mem_banks/M/properties,io_links/M/properties,p2p_links/M/properties}, every
properties file `key value` lines in decimal. CPU nodes come first (gpu_id 0), then GPU
nodes; a GPU node names its PCI function by `domain` and `location_id` = (bus << 8) |
devfn; it has no NUMA key (its type-2 io_link names its CPU node, whose
cpu_core_id_base names a CPU). One physical GPU in a compute partition mode (DPX, QPX,
CPX) is several nodes with one location_id. io_link type 11 is xGMI; `hive_id` groups
the GPUs of one xGMI hive; `unique_id` is what ROCr's GPU-<hex> ids name.

Parsers take text and return values; read_kfd_nodes is the thin shell; amd_gpus judges.
`amdsmi` (AMD SMI's Python binding) fills in names and memory on a live host when it
imports; it is never required.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import AmdGpu, Gpu, NumaNode, PciDevice
from topod.record import field, record

KFD_TOPOLOGY = "sys/class/kfd/kfd/topology"
PCI_DEVICES = "sys/bus/pci/devices"
AMD_VENDOR = 0x1002
LINK_PCIE, LINK_XGMI = 2, 11
MAX_NODES = 1024  # 8 GPUs x 8 partitions + CPUs is 66; far past this a tree is hostile
MAX_LINKS = 1024
HEAP_FRAME_BUFFER = (1, 2)  # HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC / _PRIVATE: the GPU's own memory
COMPUTE_PARTITIONS = ("SPX", "DPX", "TPX", "QPX", "CPX")
MEMORY_PARTITIONS = ("NPS1", "NPS2", "NPS4", "NPS8")
# PCI device id -> marketing name (AMD's own names, as amd-smi's market_name gives them).
AMD_MODELS = {
    0x738C: "AMD Instinct MI100",
    0x7408: "AMD Instinct MI250X",
    0x740C: "AMD Instinct MI250X/MI250",
    0x740F: "AMD Instinct MI210",
    0x74A0: "AMD Instinct MI300A",
    0x74A1: "AMD Instinct MI300X",
    0x74A2: "AMD Instinct MI308X",
    0x74A5: "AMD Instinct MI325X",
    0x74A9: "AMD Instinct MI300X HF",
    0x74B5: "AMD Instinct MI300X VF",
    0x75A0: "AMD Instinct MI350X",
    0x75A3: "AMD Instinct MI355X",
}
# KFD's node name is the ASIC's name, and just "ip discovery" on every part since MI300.
UNINFORMATIVE_NAMES = ("", "ip discovery")


@record
class KfdLink:
    type: int
    node_to: int
    weight: int | None
    max_bandwidth: int | None = None  # MB/s, where the kernel knows it


@record
class KfdNode:
    number: int
    gpu_id: int  # 0 for a CPU node
    name: str
    properties: dict[str, int]
    memory_bytes: int  # frame-buffer heaps (GPU) or system heaps (CPU), summed
    io_links: tuple[KfdLink, ...] = ()
    p2p_links: tuple[KfdLink, ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.gpu_id != 0

    def value(self, key: str) -> int | None:
        return self.properties.get(key)

    @property
    def pci_address(self) -> str | None:
        """'dddd:bb:ss.f' from domain and location_id; None on a CPU node or without them."""
        location, domain = self.value("location_id"), self.value("domain")
        if not self.is_gpu or location is None:
            return None
        return pci_address(domain or 0, location)


@record(frozen=False)
class AmdFacts:
    """What KFD gives beside the GPUs: xGMI links between GPU indices and the hives."""

    gpus: list[Gpu] = field(default_factory=list)
    xgmi: dict[tuple[int, int], int] = field(default_factory=dict)
    hives: tuple[tuple[int, ...], ...] = ()


def pci_address(domain: int, location_id: int) -> str:
    """KFD's (domain, location_id) -> sysfs's PCI address: location_id = (bus << 8) | devfn."""
    bus, devfn = (location_id >> 8) & 0xFF, location_id & 0xFF
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


def parse_properties(text: str) -> tuple[dict[str, int], list[str]]:
    """KFD's `key value` lines -> ({key: int}, [lines that were not such a pair])."""
    values: dict[str, int] = {}
    bad: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[0].replace("_", "").isalnum():
            bad.append(line)
            continue
        try:
            values[parts[0]] = int(parts[1], 10)
        except ValueError:
            bad.append(line)
    return values, bad


def parse_link(values: Mapping[str, int]) -> KfdLink | None:
    if "type" not in values or "node_to" not in values:
        return None
    return KfdLink(type=values["type"], node_to=values["node_to"], weight=values.get("weight"),
                   max_bandwidth=values.get("max_bandwidth") or None)


def parse_partition(text: str | None, known: tuple[str, ...]) -> str | None:
    """amdgpu's current_compute_partition / current_memory_partition ('SPX\\n') -> 'SPX';
    None when absent or not a mode amdgpu names."""
    if text is None:
        return None
    value = text.strip().upper()
    return value if value in known else None


def model_name(device_id: int | None, kfd_name: str | None, product_name: str | None = None) -> str:
    """The marketing name of an AMD GPU: the device id table, else amdgpu's product_name,
    else KFD's node name (when it says more than 'ip discovery'), else the PCI id."""
    if device_id is not None and device_id in AMD_MODELS:
        return AMD_MODELS[device_id]
    if product_name and product_name.strip():
        return product_name.strip()
    if kfd_name and kfd_name.strip().lower() not in UNINFORMATIVE_NAMES:
        return kfd_name.strip()
    return f"AMD {AMD_VENDOR:04x}:{device_id:04x}" if device_id is not None else "AMD GPU"


# ---------------------------------------------------------------- the shell: reading the tree


def _read_properties(host: HostRoot, rel: str, notes: Notes) -> dict[str, int] | None:
    text = host.read(rel)
    if text is None:
        return None
    values, bad = parse_properties(text)
    if bad:
        notes.add("bad_value", rel, f"{len(bad)} line(s) not `key decimal`: {bad[0][:40]!r}; ignored")
    return values


def _numbered(host: HostRoot, rel: str, notes: Notes, limit: int) -> list[int]:
    names = [int(name) for name in host.listdir(rel) if name.isdigit() and len(name) < 7]
    if len(names) > limit:
        notes.add("kfd_too_many", rel, f"{len(names)} entries; only the first {limit} read")
    return sorted(names)[:limit]


def _read_links(host: HostRoot, rel: str, notes: Notes) -> tuple[KfdLink, ...]:
    links = []
    for number in _numbered(host, rel, notes, MAX_LINKS):
        values = _read_properties(host, f"{rel}/{number}/properties", notes)
        link = parse_link(values) if values is not None else None
        if link is not None:
            links.append(link)
    return tuple(links)


def read_kfd_nodes(host: HostRoot, notes: Notes) -> list[KfdNode]:
    """Every KFD node of the tree, in node order; [] when amdgpu's KFD is absent."""
    nodes = []
    base = f"{KFD_TOPOLOGY}/nodes"
    for number in _numbered(host, base, notes, MAX_NODES):
        rel = f"{base}/{number}"
        properties = _read_properties(host, f"{rel}/properties", notes)
        if properties is None:
            continue  # a node mid-removal (hot unplug): the next scan sees the rest
        gpu_id_text = (host.read_line(f"{rel}/gpu_id") or "0").strip()
        gpu_id = int(gpu_id_text) if gpu_id_text.isdigit() else 0
        memory = 0
        for bank in _numbered(host, f"{rel}/mem_banks", notes, MAX_LINKS):
            values = _read_properties(host, f"{rel}/mem_banks/{bank}/properties", notes) or {}
            if (values.get("heap_type") in HEAP_FRAME_BUFFER) == (gpu_id != 0):
                memory += max(0, values.get("size_in_bytes", 0))
        nodes.append(KfdNode(number=number, gpu_id=gpu_id, name=(host.read_line(f"{rel}/name") or "").strip(),
                             properties=properties, memory_bytes=memory,
                             io_links=_read_links(host, f"{rel}/io_links", notes),
                             p2p_links=_read_links(host, f"{rel}/p2p_links", notes)))
    return nodes


@record
class PciAttributes:
    """amdgpu's files on a GPU's PCI function."""

    compute_partition: str | None = None
    memory_partition: str | None = None
    vram_bytes: int | None = None
    product_name: str | None = None
    cards: tuple[int, ...] = ()


def read_pci_attributes(host: HostRoot, address: str, names: Iterable[str]) -> PciAttributes:
    base = f"{PCI_DEVICES}/{address}"
    vram = (host.read_line(f"{base}/mem_info_vram_total") or "").strip()
    cards = sorted(int(name[4:]) for name in names if name.startswith("card") and name[4:].isdigit())
    return PciAttributes(
        compute_partition=parse_partition(host.read(f"{base}/current_compute_partition"), COMPUTE_PARTITIONS),
        memory_partition=parse_partition(host.read(f"{base}/current_memory_partition"), MEMORY_PARTITIONS),
        vram_bytes=int(vram) if vram.isdigit() else None,
        product_name=host.read_line(f"{base}/product_name"),
        cards=tuple(cards))


def read_amdsmi(host: HostRoot, notes: Notes) -> dict[str, dict[str, object]]:
    """PCI address -> {'name', 'vram_mib'} from amdsmi on the live host; {} when it does not
    import or the root is a captured tree (its library would describe this machine)."""
    if not host.is_live:
        return {}
    try:
        import amdsmi  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - optional: not installed, or its libamd_smi.so is missing
        return {}
    found: dict[str, dict[str, object]] = {}
    try:
        amdsmi.amdsmi_init()
        try:
            for handle in amdsmi.amdsmi_get_processor_handles():
                address = str(amdsmi.amdsmi_get_gpu_device_bdf(handle)).lower()
                asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
                vram = amdsmi.amdsmi_get_gpu_vram_info(handle)
                found[address] = {"name": asic.get("market_name"), "vram_mib": vram.get("vram_size")}
        finally:
            amdsmi.amdsmi_shut_down()
    except Exception as exc:  # noqa: BLE001 - a library fault costs its extras, never discovery
        notes.add("amdsmi_failed", "amdsmi", f"{type(exc).__name__}: {exc}; AMD GPUs from KFD and sysfs only")
    return found


# ---------------------------------------------------------------- judging: GPUs from nodes


def _cpu_node_numa(nodes: list[KfdNode], numa: list[NumaNode]) -> dict[int, int]:
    """KFD CPU node number -> NUMA node id, through the CPU its cpu_core_id_base names."""
    node_of_cpu = {cpu: node.id for node in numa for cpu in node.cpus}
    out = {}
    for node in nodes:
        base = node.value("cpu_core_id_base")
        if not node.is_gpu and base is not None and base in node_of_cpu:
            out[node.number] = node_of_cpu[base]
    return out


def group_gpu_nodes(nodes: list[KfdNode], notes: Notes) -> dict[str, list[KfdNode]]:
    """PCI address -> the GPU nodes on that function (several in DPX/QPX/CPX), in node order."""
    groups: dict[str, list[KfdNode]] = {}
    for node in nodes:
        if not node.is_gpu:
            continue
        address = node.pci_address
        if address is None:
            notes.add("kfd_gpu_without_location", f"{KFD_TOPOLOGY}/nodes/{node.number}/properties",
                      "GPU node without location_id: not matched to a PCI function; skipped")
            continue
        groups.setdefault(address, []).append(node)
    return groups


def amd_gpus(nodes: list[KfdNode], devices: list[PciDevice], numa: list[NumaNode],
             attributes: Mapping[str, PciAttributes], live: Mapping[str, Mapping[str, object]],
             first_index: int, notes: Notes) -> AmdFacts:
    """GPUs (indexed from first_index in KFD node order, which is ROCr's), their xGMI links
    and hives. A node whose PCI function sysfs does not list is kept, its locality unknown."""
    by_address = {device.address: device for device in devices}
    cpu_numa = _cpu_node_numa(nodes, numa)
    groups = group_gpu_nodes(nodes, notes)
    facts = AmdFacts()
    index_of_node: dict[int, int] = {}
    for offset, (address, members) in enumerate(groups.items()):
        index = first_index + offset
        first = members[0]
        device = by_address.get(address)
        if device is None:
            notes.add("kfd_gpu_not_in_sysfs", f"{PCI_DEVICES}/{address}",
                      f"KFD node {first.number} names PCI function {address}, which sysfs does not list; "
                      "its locality is unknown")
        attrs = attributes.get(address, PciAttributes())
        extra = live.get(address, {})
        for member in members:
            index_of_node[member.number] = index
        numa_node = device.numa_node if device is not None else None
        if numa_node is None:
            numa_node = next((cpu_numa[link.node_to] for link in first.io_links
                              if link.type == LINK_PCIE and link.node_to in cpu_numa), None)
        device_id = first.value("device_id") or (device.device if device is not None else None)
        facts.gpus.append(Gpu(
            index=index, address=address,
            uuid=f"GPU-{first.value('unique_id'):016x}" if first.value("unique_id") else None,
            name=str(extra.get("name") or model_name(device_id, first.name, attrs.product_name)),
            memory_total_mib=_memory_mib(members, attrs, extra),
            compute_capability=None, numa_node=numa_node, source="amdsmi-live" if extra else "kfd",
            vendor="amd", model=model_name(device_id, first.name, attrs.product_name),
            amd=AmdGpu(kfd_nodes=tuple(m.number for m in members), gpu_id=first.gpu_id,
                       unique_id=first.value("unique_id") or None, hive_id=first.value("hive_id") or None,
                       render_minor=first.value("drm_render_minor"),
                       card=attrs.cards[0] if attrs.cards else None,
                       gfx_target_version=first.value("gfx_target_version") or None,
                       compute_partition=attrs.compute_partition or ("SPX" if len(members) == 1 else None),
                       memory_partition=attrs.memory_partition,
                       render_minors=tuple(m.value("drm_render_minor") for m in members
                                           if m.value("drm_render_minor") is not None))))
    facts.xgmi = _xgmi_pairs(nodes, index_of_node)
    facts.hives = _hives(facts.gpus, facts.xgmi)
    return facts


def _memory_mib(members: list[KfdNode], attrs: PciAttributes, live: Mapping[str, object]) -> int | None:
    """amdgpu's mem_info_vram_total, else the largest partition's frame buffer times the
    NPS count (partitions in NPS1 all see the whole memory; in NPS4 a quarter each)."""
    if attrs.vram_bytes:
        return attrs.vram_bytes // 2**20
    if isinstance(live.get("vram_mib"), int):
        return int(live["vram_mib"])  # type: ignore[arg-type]
    largest = max((m.memory_bytes for m in members), default=0)
    if not largest:
        return None
    nps = int(attrs.memory_partition[3:]) if attrs.memory_partition else 1
    return largest * nps // 2**20


def _xgmi_pairs(nodes: list[KfdNode], index_of_node: Mapping[int, int]) -> dict[tuple[int, int], int]:
    """(a<b) GPU indices -> xGMI links, counted from each side and the larger side kept (a
    link the kernel lists one way only still counts); partitions of one GPU add nothing."""
    seen: dict[tuple[int, int, int], int] = {}  # (from GPU, to GPU, from node) -> links
    for node in nodes:
        source = index_of_node.get(node.number)
        if source is None:
            continue
        for link in node.io_links or node.p2p_links:
            target = index_of_node.get(link.node_to)
            if link.type == LINK_XGMI and target is not None and target != source:
                key = (source, target, node.number)
                seen[key] = seen.get(key, 0) + 1
    pairs: dict[tuple[int, int], int] = {}
    for (source, target, _node), links in seen.items():
        key = (min(source, target), max(source, target))
        pairs[key] = max(pairs.get(key, 0), links)
    return pairs


def _hives(gpus: list[Gpu], xgmi: Mapping[tuple[int, int], int]) -> tuple[tuple[int, ...], ...]:
    """GPUs grouped by hive_id (two or more each); where KFD gives no hive_id, the GPUs
    joined by xGMI links."""
    by_hive: dict[int, list[int]] = {}
    for gpu in gpus:
        if gpu.amd is not None and gpu.amd.hive_id:
            by_hive.setdefault(gpu.amd.hive_id, []).append(gpu.index)
    grouped = {g for members in by_hive.values() for g in members}
    parent: dict[int, int] = {}

    def find(g: int) -> int:
        while parent.get(g, g) != g:
            g = parent[g]
        return g

    for a, b in xgmi:
        if a not in grouped and b not in grouped:
            parent[find(a)] = find(b)
    components: dict[int, list[int]] = {}
    for g in {g for pair in xgmi for g in pair} - grouped:
        components.setdefault(find(g), []).append(g)
    hives = [sorted(members) for members in [*by_hive.values(), *components.values()] if len(members) > 1]
    return tuple(tuple(hive) for hive in sorted(hives))
