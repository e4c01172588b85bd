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
downstream ports and root ports disappear. Attributes topod does not know (subsystem
ids, GDR support, NIC speed) are left out so that NCCL fills them itself, rather than
written as guesses. The CPU's identity (arch, and for x86 vendor, familyid, modelid) is
the exception NCCL does not fill everywhere: it reads it from the machine only for the
<cpu> above a rank's own GPU (ncclTopoGetXmlFromSys), so any other <cpu> without it (one
holding only NICs, or another rank's GPUs: ncclTopoFuseXml merges two <cpu> elements only
when every attribute agrees) makes ncclTopoGetSystemFromXml fail with "Attribute arch of
node cpu not found" (NCCL 2.30.7's own parser and system builder, run on these files).
topod takes it from the host's /proc/cpuinfo; where that says nothing, the file is still
written, with a `nccl_cpu_identity_unknown` warning.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from topod.errors import ConfigError
from topod.host import HostRoot
from topod.model import Gpu, HostWarning, PciDevice, Topology, gts

DEFAULT_PATH = "/var/run/nvidia-topologyd/virtualTopology.xml"  # NCCL's default location
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


def parse_cpuinfo(text: str | None) -> CpuIdentity:
    """/proc/cpuinfo -> CpuIdentity from its first processor block (fields absent stay None)."""
    fields: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    vendor = fields.get("vendor_id")
    arch = None
    if vendor:
        arch = "x86_64"
    elif "cpu implementer" in fields:
        arch = "arm64"
    elif fields.get("cpu", "").upper().startswith("POWER"):
        arch = "ppc64"
    return CpuIdentity(arch=arch, vendor=vendor, familyid=_int(fields.get("cpu family")),
                       modelid=_int(fields.get("model")))


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


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
        if gpu.compute_capability is not None:
            major, minor = gpu.compute_capability
            attrs.append(("sm", str(major * 10 + minor)))
        attrs.append(("rank", str(self.gpus.index(gpu))))  # NCCL replaces it with the comm rank
        if self.gdr is not None:
            attrs.append(("gdr", "1" if self.gdr else "0"))
        return Element("gpu", attrs, self._nvlinks(gpu))

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


def write_nccl_topology(text: str, path: str | os.PathLike[str] = DEFAULT_PATH) -> Path:
    """Write the XML atomically: a temp file in the same directory, fsync, rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="ascii") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)  # NCCL runs as the job's user
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    return target


@dataclass(frozen=True, slots=True)
class NcclHostFacts:
    """What the XML needs from the host tree beyond the Topology (read by the shell)."""

    cpu_identity: CpuIdentity
    net_names: dict[str, str]
    subsystem_ids: dict[str, tuple[int, int]]
    gdr: bool | None


# Modules whose presence means GPUDirect RDMA works (what NCCL's ncclGpuGdrSupport checks).
_GDR_MARKERS = ("sys/kernel/mm/memory_peers/nv_mem/version", "sys/module/nvidia_peermem/version",
                "sys/module/nv_peer_mem/version")


def read_nccl_host_facts(host: HostRoot, topology: Topology) -> NcclHostFacts:
    """CPU identity, NIC names, subsystem ids and GDR support from the host tree."""
    net_names: dict[str, str] = {}
    subsystem_ids: dict[str, tuple[int, int]] = {}
    for device in topology.pci_devices:
        base = f"sys/bus/pci/devices/{device.address}"
        if device.kind in NIC_KINDS:
            # NCCL's IB transport names a NIC by its RDMA device, the socket transport by netdev.
            names = host.listdir(f"{base}/infiniband") or host.listdir(f"{base}/net")
            if names:
                net_names[device.address] = names[0]
        vendor, product = _int(host.read_line(f"{base}/subsystem_vendor")), _int(host.read_line(f"{base}/subsystem_device"))
        if vendor is not None and product is not None:
            subsystem_ids[device.address] = (vendor, product)
    # Absent markers mean "unknown" (dma-buf may still give GDR), so NCCL decides, not us.
    gdr = True if any(host.exists(marker) for marker in _GDR_MARKERS) else None
    return NcclHostFacts(parse_cpuinfo(host.read("proc/cpuinfo")), net_names, subsystem_ids, gdr)


@dataclass(frozen=True, slots=True)
class NcclFile:
    text: str
    warnings: tuple[HostWarning, ...]


def host_nccl_xml(host: HostRoot, topology: Topology, *, gpus: Iterable[int] | None = None,
                  cpus: Iterable[int] | None = None, nics: Iterable[str] | None = None) -> NcclFile:
    """The NCCL topology XML of a host (or of a subset of its GPUs and CPUs), with the
    facts only the host tree knows: what `topoctl export nccl` and the daemon write."""
    facts = read_nccl_host_facts(host, topology)
    system = build_nccl_xml(topology, gpus=gpus, cpus=cpus, cpu_identity=facts.cpu_identity,
                            net_names=facts.net_names, subsystem_ids=facts.subsystem_ids, gdr=facts.gdr,
                            nics=nics)
    return NcclFile(render_nccl_xml(system), tuple(identity_warnings(system)))


def identity_warnings(system: Element) -> list[HostWarning]:
    """The file's <cpu> elements NCCL cannot build its topology from (see the module's
    note): any without `arch`, unless it is the only one and holds a GPU, which each rank
    fills alike from the machine."""
    cpus = [child for child in system.children if child.name == "cpu"]
    unknown = [cpu for cpu in cpus if all(key != "arch" for key, _ in cpu.attrs)]
    if not unknown or (len(cpus) == 1 and _holds(cpus[0], "gpu")):
        return []
    nodes = ", ".join(value for cpu in unknown for key, value in cpu.attrs if key == "numaid")
    return [HostWarning("nccl_cpu_identity_unknown", "proc/cpuinfo",
                        f"no CPU identity (vendor_id, CPU implementer or cpu line), so the <cpu> elements of NUMA "
                        f"node(s) {nodes} have no arch: NCCL fills it only on the CPU above a rank's own GPU and "
                        f"fails to build its topology from this file (\"Attribute arch of node cpu not found\")")]


def _holds(element: Element, name: str) -> bool:
    return any(child.name == name or _holds(child, name) for child in element.children)
