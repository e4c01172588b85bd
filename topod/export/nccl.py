"""An NCCL topology XML (the NCCL_TOPO_FILE format) from topod's host model.

NCCL reads this file instead of (and then fills gaps from) /sys. What topod adds over
NCCL's own detection: each device sits under the CPU of its *corrected* NUMA node (a
firmware numa_node of -1 is placed by local_cpus or its bridge, as topod discovered),
NVSwitch link counts come from the fabric topod saw, and a lease gets a file that
holds only its GPUs and their local NICs, with the CPU affinity narrowed to its cores.

The layout follows NCCL's src/graph/xml.cc exactly, because NCCL's parser is not a
general XML parser: no <?xml?> declaration, attributes separated by one space, values
in double quotes with no escapes, `<x/>` without a space, 2-space indent. The PCI
nesting is the one ncclTopoGetXmlFromSys builds from a sysfs path: walking up two
levels at a time, so PCIe switch upstream ports become nested <pci> elements and
downstream ports and root ports disappear. What only the host tree knows (the CPU's
identity, NIC names, subsystem ids, GDR support) is read by topod.export.nccl_host and
passed in; an attribute it could not read (and NIC speed, always) is left out so that
NCCL fills it itself, rather than written as a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from topod.errors import ConfigError
from topod.model import Gpu, PciDevice, Topology, gts

XML_VERSION = "1"  # NCCL_TOPO_XML_VERSION
MAX_VALUE = 254  # NCCL's MAX_STR_LEN is 255 with the terminator
NIC_KINDS = ("rdma", "nic")
# tclass of an NVLink's far end when topod has no PCI class for it (NCCL's constants).
_TCLASS = {"switch": "0x068000", "cpu": "0x068001", "gpu": "0x030200"}


@dataclass(frozen=True, slots=True)
class CpuIdentity:
    """What NCCL's <cpu> element wants beyond the NUMA node; None fields are left out."""

    arch: str | None = None  # x86_64 | arm64 | ppc64
    vendor: str | None = None  # GenuineIntel | AuthenticAMD | ...
    familyid: int | None = None
    modelid: int | None = None


@dataclass(slots=True)
class Element:
    name: str
    attrs: list[tuple[str, str]] = field(default_factory=list)
    children: list[Element] = field(default_factory=list)

    def render(self, indent: int = 0) -> list[str]:
        pad = " " * indent
        head = pad + "<" + self.name + "".join(f' {key}="{_checked(key, value)}"' for key, value in self.attrs)
        if not self.children:
            return [head + "/>"]
        lines = [head + ">"]
        for child in self.children:
            lines.extend(child.render(indent + 2))
        lines.append(f"{pad}</{self.name}>")
        return lines


def _checked(key: str, value: str) -> str:
    if any(ch in value for ch in '"<>&\n') or len(value) > MAX_VALUE:
        raise ConfigError(f"NCCL topology: attribute {key}={value!r} cannot be written in NCCL's XML dialect")
    return value


def build_nccl_xml(
    topology: Topology,
    *,
    gpus: Iterable[int] | None = None,
    cpus: Iterable[int] | None = None,
    cpu_identity: CpuIdentity | None = None,
    net_names: Mapping[str, str] | None = None,
    subsystem_ids: Mapping[str, tuple[int, int]] | None = None,
    gdr: bool | None = None,
    nics: Iterable[str] | None = None,
) -> Element:
    """The <system> tree: all GPUs and NICs, or (gpus=...) one lease's GPUs and local NICs,
    or (nics=PCI addresses) exactly the lease's NICs (topod.alloc.nics).

    net_names maps a NIC's PCI address to the name NCCL's transport reports (the RDMA
    device, e.g. mlx5_0, or the netdev for sockets); subsystem_ids maps an address to
    (subsystem_vendor, subsystem_device). Both come from the host tree via the shell.
    """
    chosen = _chosen_gpus(topology, gpus)
    nodes = {gpu.numa_node for gpu in chosen}
    wanted_nics = None if nics is None else set(nics)
    nics = [d for d in topology.devices_of_kind(*NIC_KINDS)
            if (d.address in wanted_nics if wanted_nics is not None else gpus is None or d.numa_node in nodes)]
    system = Element("system", [("version", XML_VERSION)])
    context = _Context(topology, chosen, net_names or {}, subsystem_ids or {}, gdr)
    cpu_elements: dict[int, Element] = {}
    for device in sorted([topology.device(g.address) or _bare_device(g) for g in chosen] + nics,
                         key=lambda d: d.address):
        node = device.numa_node if device.numa_node is not None and topology.node(device.numa_node) else -1
        cpu = cpu_elements.get(node)
        if cpu is None:
            cpu = cpu_elements[node] = _cpu_element(topology, node, cpus, cpu_identity or CpuIdentity())
        context.attach(cpu, device)
    system.children = [cpu_elements[node] for node in sorted(cpu_elements)]
    return system


def render_nccl_xml(system: Element) -> str:
    return "\n".join(system.render()) + "\n"


def _chosen_gpus(topology: Topology, wanted: Iterable[int] | None) -> list[Gpu]:
    if wanted is None:
        return list(topology.gpus)
    indices = sorted(set(wanted))
    missing = [i for i in indices if topology.gpu(i) is None]
    if missing:
        raise ConfigError(f"NCCL topology: GPUs {missing} are not on this host")
    return [gpu for gpu in topology.gpus if gpu.index in indices]


def _bare_device(gpu: Gpu) -> PciDevice:
    # NVML reports a GPU that sysfs does not show: place it by what NVML says, no parents.
    return PciDevice(address=gpu.address, vendor=None, device=None, class_code=None, kind="gpu", driver=None,
                     parent=None, root_complex="", root_port=None, switch=None, numa_node_raw=None,
                     numa_node=gpu.numa_node, numa_node_source="unknown", local_cpus=(), link=None, msi_irqs=())


def _cpu_element(topology: Topology, node_id: int, cpus: Iterable[int] | None, ident: CpuIdentity) -> Element:
    attrs = [("numaid", str(node_id))]
    node = topology.node(node_id)
    if node is not None:
        mine = set(node.cpus or node.local_cpus)
        if cpus is not None:
            # A lease's file binds NCCL's threads to the lease's cores when they are on this node.
            mine = (mine & set(cpus)) or mine
        if mine:
            attrs.append(("affinity", cpumask(mine)))
    for key in ("arch", "vendor", "familyid", "modelid"):
        value = getattr(ident, key)
        if value is not None:
            attrs.append((key, str(value)))
    return Element("cpu", attrs)


def cpumask(cpus: Iterable[int]) -> str:
    """{0..15, 32..47} -> '0000ffff,0000ffff' (the sysfs cpumap format NCCL parses)."""
    bits = 0
    for cpu in cpus:
        bits |= 1 << cpu
    words = []
    while True:
        words.append(f"{bits & 0xFFFFFFFF:08x}")
        bits >>= 32
        if not bits:
            break
    return ",".join(reversed(words))


@dataclass(slots=True)
class _Context:
    topology: Topology
    gpus: list[Gpu]
    net_names: Mapping[str, str]
    subsystem_ids: Mapping[str, tuple[int, int]]
    gdr: bool | None
    pci: dict[str, Element] = field(default_factory=dict)
    net_count: int = 0

    def attach(self, cpu: Element, device: PciDevice) -> None:
        parent = cpu
        for address in nccl_parents(self.topology, device):
            element = self.pci.get(address)
            if element is None:
                bridge = self.topology.device(address)
                element = self.pci[address] = Element("pci", self._pci_attrs(bridge) if bridge else [("busid", address)])
                _insert_sorted(parent, element)
            parent = element
        element = Element("pci", self._pci_attrs(device))
        gpu = next((g for g in self.gpus if g.address == device.address), None)
        if gpu is not None:
            element.children.append(self._gpu_element(gpu))
        elif device.kind in NIC_KINDS:
            name = self.net_names.get(device.address)
            if name is None and device.kind == "nic" and device.names:
                name = device.names[0]  # an Ethernet NIC's children are its netdevs
            # An RDMA NIC's names mix netdevs and RDMA devices; without net_names, no guess.
            if name:
                net = Element("net", [("name", name), ("dev", str(self.net_count))])
                self.net_count += 1
                element.children.append(Element("nic", [], [net]))
        _insert_sorted(parent, element)

    def _pci_attrs(self, device: PciDevice) -> list[tuple[str, str]]:
        attrs = [("busid", device.address.lower())]
        if device.class_code is not None:
            attrs.append(("class", f"0x{device.class_code:06x}"))
        if device.vendor is not None:
            attrs.append(("vendor", f"0x{device.vendor:04x}"))
        if device.device is not None:
            attrs.append(("device", f"0x{device.device:04x}"))
        ids = self.subsystem_ids.get(device.address)
        if ids is not None:
            attrs += [("subsystem_vendor", f"0x{ids[0]:04x}"), ("subsystem_device", f"0x{ids[1]:04x}")]
        speed, width = link_of(self.topology, device)
        if speed is not None:
            attrs.append(("link_speed", speed))
        if width is not None:
            attrs.append(("link_width", str(width)))
        return attrs

    def _gpu_element(self, gpu: Gpu) -> Element:
        attrs = [("dev", str(gpu.index))]
        if gpu.amd is not None and gpu.amd.gfx_target_version:
            version = gpu.amd.gfx_target_version  # RCCL's sm is gfx major*10 + minor, gcn the target
            attrs += [("sm", str(version // 10000 * 10 + version // 100 % 100)), ("gcn", gpu.amd.gfx_target or "")]
        if gpu.compute_capability is not None:
            major, minor = gpu.compute_capability
            attrs.append(("sm", str(major * 10 + minor)))
        attrs.append(("rank", str(self.gpus.index(gpu))))  # NCCL replaces it with the comm rank
        if self.gdr is not None:
            attrs.append(("gdr", "1" if self.gdr else "0"))
        return Element("gpu", attrs, self._nvlinks(gpu) + self._xgmi(gpu))

    def _xgmi(self, gpu: Gpu) -> list[Element]:
        """RCCL's <xgmi target=... count=... tclass=.../>: one per chosen peer it has links to."""
        fabric = self.topology.nvlink
        if not fabric.xgmi:
            return []
        elements = []
        for peer in sorted(self.gpus, key=lambda g: g.address):
            count = fabric.xgmi_between(gpu.index, peer.index) if peer.index != gpu.index else 0
            if count:
                remote = self.topology.device(peer.address)
                tclass = f"0x{remote.class_code:06x}" if remote and remote.class_code is not None else "0x120000"
                elements.append(Element("xgmi", [("target", peer.address.lower()), ("count", str(count)),
                                                 ("tclass", tclass)]))
        return elements

    def _nvlinks(self, gpu: Gpu) -> list[Element]:
        chosen = {g.address for g in self.gpus}
        counts: dict[tuple[str, str], int] = {}
        for link in gpu.nvlinks:
            target = link.remote_pci_bus_id.lower()
            if not link.active or (link.remote_device_type == "gpu" and target not in chosen):
                continue  # a GPU outside this file (another lease) is no NVLink peer here
            key = (target, link.remote_device_type)
            counts[key] = counts.get(key, 0) + 1
        elements = []
        for (target, kind), count in sorted(counts.items()):
            remote = self.topology.device(target)
            tclass = f"0x{remote.class_code:06x}" if remote and remote.class_code is not None else _TCLASS[kind]
            elements.append(Element("nvlink", [("target", target), ("count", str(count)), ("tclass", tclass)]))
        return elements


def _insert_sorted(parent: Element, child: Element) -> None:
    # NCCL keeps PCI children ordered by bus id (NCCL issue #820); so do we.
    parent.children.append(child)
    parent.children.sort(key=lambda e: dict(e.attrs).get("busid", ""))


def pci_path(topology: Topology, device: PciDevice) -> list[str]:
    """Addresses from the root port down to the device itself, by parent links."""
    path = [device.address]
    seen = {device.address}
    current = device
    while current.parent is not None and current.parent not in seen:
        seen.add(current.parent)
        path.append(current.parent)
        parent = topology.device(current.parent)
        if parent is None:
            break
        current = parent
    return list(reversed(path))


def nccl_parents(topology: Topology, device: PciDevice) -> list[str]:
    """The <pci> ancestors NCCL would create, outermost first: every second bridge going up."""
    path = pci_path(topology, device)
    return [path[i] for i in range(len(path) - 3, -1, -2)][::-1]


def link_of(topology: Topology, device: PciDevice) -> tuple[str | None, int | None]:
    """(link_speed, link_width) of the device's upstream link, the slower of its two ends.

    Speed comes from max_link_speed, as NCCL reads it (GPUs drop the trained speed when
    idle, so the current speed would under-report); width from the trained width when
    known, because a link trained at fewer lanes stays that way and is a real bottleneck.
    """
    ends = [d for d in (device, topology.device(device.parent) if device.parent else None) if d and d.link]
    speeds = [d.link.max_speed or d.link.current_speed for d in ends]
    speeds = [s for s in speeds if s and gts(s) is not None]
    widths = [d.link.current_width or d.link.max_width for d in ends]
    widths = [w for w in widths if w]
    speed = min(speeds, key=lambda s: gts(s) or 0.0) if speeds else None
    return speed, (min(widths) if widths else None)
