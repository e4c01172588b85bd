"""The PCI tree from sysfs: every function, its bridges, switches, link and locality."""

from __future__ import annotations

from topod.cpulist import CpuListRangeError, parse_cpulist, parse_cpumask
from topod.discover.devnames import nested_child_names
from topod.discover.memo import DiscoveryMemo, PciIdentity, directory_stamp
from topod.discover.notes import Notes
from topod.host import HostDir, HostRoot
from topod.discover.rdma import read_rdma_ports
from topod.model import NumaNode, PciDevice, PciLink, RdmaPort
from topod.record import field, record
from topod.sysnames import is_host_bridge, is_pci_address

BUS_DIR = "sys/bus/pci/devices"

NVIDIA = 0x10DE
AMD_ATI = 0x1002
CHILD_NAME_DIRS = ("net", "infiniband", "nvme", "drm")


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


@record(frozen=False)
class RawFunction:
    """One PCI function as read, before switches and locality are worked out."""

    address: str
    sysfs_path: str
    root_complex: str
    ancestors: list[str]  # PCI addresses above it in the device path, top first
    vendor: int | None
    device: int | None
    class_code: int | None
    driver: str | None
    numa_node_raw: int | None
    local_cpus: list[int] | None
    link: PciLink | None
    msi_irqs: list[int]
    names: list[str] = field(default_factory=list)
    has_infiniband: bool = False
    rdma_ports: list[RdmaPort] = field(default_factory=list)


def _quote(text: str, width: int = 40) -> str:
    """Host text in a warning: quoted and cut short."""
    return repr(text) if len(text) <= width else repr(text[:width]) + f"... ({len(text)} chars)"


@record(frozen=False)
class _Attrs:
    """A function's sysfs directory, opened and listed once: its attributes are read by
    name (no path lookup each), and those the listing lacks are not tried at all."""

    host: HostRoot
    base: str
    notes: Notes
    directory: HostDir | None
    entries: frozenset[str] | None  # None when the listing is empty or failed: try all

    @classmethod
    def of(cls, host: HostRoot, base: str, notes: Notes) -> _Attrs:
        directory = host.open_dir(base)
        if directory is None:
            return cls(host, base, notes, None, frozenset())
        return cls(host, base, notes, directory, frozenset(directory.listdir()) or None)

    def close(self) -> None:
        if self.directory is not None:
            self.directory.close()

    def has(self, name: str) -> bool:
        return self.entries is None or name in self.entries

    def text(self, name: str) -> str | None:
        return self.directory.read(name) if self.directory is not None and self.has(name) else None

    def line(self, name: str) -> str | None:
        text = self.text(name)
        return None if text is None else text.strip()

    def hex_value(self, name: str) -> int | None:
        text = self.line(name)
        if text is None:
            return None
        try:
            return int(text, 16)
        except ValueError:
            self.notes.add("bad_value", f"{self.base}/{name}", f"not a hex number: {_quote(text)}")
            return None

    def int_value(self, name: str) -> int | None:
        text = self.line(name)
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            self.notes.add("bad_value", f"{self.base}/{name}", f"not an integer: {_quote(text)}")
            return None

    def listdir(self, name: str) -> list[str]:
        return self.host.listdir(f"{self.base}/{name}") if self.has(name) else []


def _read_local_cpus(attrs: _Attrs) -> list[int] | None:
    notes, base = attrs.notes, attrs.base
    text = attrs.text("local_cpulist")
    if text is not None:
        try:
            return parse_cpulist(text, notes.cpu_limit)
        except CpuListRangeError as exc:
            notes.add("cpulist_out_of_range", f"{base}/local_cpulist", f"{exc}; tried local_cpus")
        except ValueError:
            notes.add("bad_value", f"{base}/local_cpulist", "not a CPU list; tried local_cpus")
    text = attrs.text("local_cpus")
    if text is not None:
        try:
            return parse_cpumask(text, notes.cpu_limit)
        except CpuListRangeError as exc:
            notes.add("cpulist_out_of_range", f"{base}/local_cpus", f"{exc}; ignored")
        except ValueError:
            notes.add("bad_value", f"{base}/local_cpus", "not a CPU mask; ignored")
    return None


def _read_identity(attrs: _Attrs) -> PciIdentity:
    """What cannot change while the function's directory lives (see topod.discover.memo)."""
    return PciIdentity(vendor=attrs.hex_value("vendor"), device=attrs.hex_value("device"),
                       class_code=attrs.hex_value("class"), max_speed=attrs.line("max_link_speed"),
                       max_width=attrs.int_value("max_link_width"))


def _read_link(attrs: _Attrs, identity: PciIdentity) -> PciLink | None:
    speed = attrs.line("current_link_speed")
    width = attrs.int_value("current_link_width")
    max_speed, max_width = identity.max_speed, identity.max_width
    if speed is None and max_speed is None and width is None and max_width is None:
        return None
    return PciLink(current_speed=speed, current_width=width, max_speed=max_speed, max_width=max_width)


def _read_msi_irqs(attrs: _Attrs) -> list[int]:
    return sorted(int(name) for name in attrs.listdir("msi_irqs") if name.isdigit())


def _child_names(attrs: _Attrs) -> tuple[list[str], list[str]]:
    """Names of the function's net/infiniband/nvme/drm children, and its infiniband ones."""
    names: list[str] = []
    infiniband: list[str] = []
    for sub in CHILD_NAME_DIRS:
        children = attrs.listdir(sub)
        names.extend(children)
        if sub == "infiniband":
            infiniband = children
    names.extend(nested_child_names(attrs.host, attrs.base, attrs.entries))  # block/, virtioN/{net,block}/
    return names, infiniband


def _split_device_path(real: str) -> tuple[str | None, list[str]]:
    """'/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0' -> ('pci0000:17', [addresses])."""
    parts = [p for p in real.split("/") if p]
    root_complex = next((p for p in parts if is_host_bridge(p)), None)
    if root_complex is None:
        return None, []
    after = parts[parts.index(root_complex) + 1 :]
    return root_complex, [p for p in after if is_pci_address(p)]


def _function_paths(host: HostRoot, notes: Notes) -> list[tuple[str, str]]:
    """(address, real sysfs path) for every function, from bus/pci/devices or, when that
    directory is absent, by walking sys/devices/pci*."""
    entries = [name for name in host.listdir(BUS_DIR) if is_pci_address(name)]
    found: list[tuple[str, str]] = []
    if entries:
        memo: dict[str, str] = {}  # the bus directory and the bridges every link shares
        for name in entries:
            real = host.resolve(f"{BUS_DIR}/{name}", memo)
            if real is None:
                notes.add("dangling_link", f"{BUS_DIR}/{name}", "link does not resolve inside the root; skipped")
                continue
            found.append((name.lower(), real))
        return found
    for top in host.listdir("sys/devices"):
        if is_host_bridge(top):
            _walk_host_bridge(host, f"/sys/devices/{top}", found, notes)
    return found


# PCIe allows 256 buses, but no real hierarchy nests bridges this deep.
MAX_PCI_DEPTH = 64


def _walk_host_bridge(host: HostRoot, path: str, found: list[tuple[str, str]], notes: Notes, depth: int = 0) -> None:
    if depth >= MAX_PCI_DEPTH:
        notes.add("pci_too_deep", path, f"more than {MAX_PCI_DEPTH} nested PCI functions; not walked further")
        return
    for name in host.listdir(path):
        child = f"{path}/{name}"
        # Links are not followed: sysfs has none among device directories, and a link
        # here could loop back up the tree.
        if is_pci_address(name) and host.is_dir(child) and host.readlink(child) is None:
            found.append((name.lower(), child))
            _walk_host_bridge(host, child, found, notes, depth + 1)


def read_functions(host: HostRoot, notes: Notes, memo: DiscoveryMemo | None = None) -> list[RawFunction]:
    """Every PCI function's attributes; with a memo (the daemon's rescan), a function's
    identity is read again only when its directory is a new one, and its local CPUs only
    when that, its numa_node or the host's CPUs changed."""
    functions: list[RawFunction] = []
    for address, real in _function_paths(host, notes):
        root_complex, chain = _split_device_path(real)
        if root_complex is None or not chain or chain[-1] != address:
            notes.add("unexpected_path", real, "PCI function outside a pciDDDD:BB host bridge: reported with "
                      "no parent and an unknown root complex, locality from its own numa_node/local_cpus")
            root_complex, chain = "", [address]
        base = real.lstrip("/")
        attrs = _Attrs.of(host, base, notes)
        try:
            if memo is None:
                identity = _read_identity(attrs)
                numa_node = attrs.int_value("numa_node")
                local_cpus = _read_local_cpus(attrs)
            else:
                stamp = directory_stamp(real, attrs.directory.fd) if attrs.directory is not None else None
                identity = memo.pci_identity(stamp, host, notes, lambda: _read_identity(attrs))
                numa_node = attrs.int_value("numa_node")
                local_cpus = memo.local_cpus_for(stamp, numa_node, host, notes, lambda: _read_local_cpus(attrs))
            functions.append(_read_function(host, address, real, root_complex, chain, attrs,
                                            identity, numa_node, local_cpus))
        finally:
            attrs.close()
    known = {f.address for f in functions}
    for f in functions:
        # A bridge sysfs does not list (hidden by firmware or not captured) is no parent:
        # like hwloc, the parent is the nearest listed ancestor.
        f.ancestors = [a for a in f.ancestors if a in known]
    functions.sort(key=lambda f: f.address)
    return functions


def _read_function(host: HostRoot, address: str, real: str, root_complex: str, chain: list[str],
                   attrs: _Attrs, identity: PciIdentity, numa_node: int | None,
                   local_cpus: list[int] | None) -> RawFunction:
    names, infiniband = _child_names(attrs)
    driver_link = host.readlink(f"{attrs.base}/driver") if attrs.has("driver") else None
    return RawFunction(
        address=address,
        sysfs_path=real,
        root_complex=root_complex,
        ancestors=[a.lower() for a in chain[:-1]],
        vendor=identity.vendor,
        device=identity.device,
        class_code=identity.class_code,
        driver=driver_link.rsplit("/", 1)[-1] if driver_link else None,
        numa_node_raw=numa_node,
        local_cpus=local_cpus,
        link=_read_link(attrs, identity),
        msi_irqs=_read_msi_irqs(attrs),
        names=names,
        has_infiniband=bool(infiniband),
        rdma_ports=read_rdma_ports(host, attrs.base, infiniband, attrs.notes) if infiniband else [],
    )


def switch_upstream_ports(functions: list[RawFunction]) -> set[str]:
    """Bridges that are the upstream port of a PCIe switch: a bridge below another bridge
    (so not a root port) with at least one bridge below it."""
    by_address = {f.address: f for f in functions}
    parent_of = {f.address: (f.ancestors[-1] if f.ancestors else None) for f in functions}
    bridge_children: dict[str, int] = {}
    for f in functions:
        parent = parent_of[f.address]
        if parent is not None and _is_pci_bridge(f):
            bridge_children[parent] = bridge_children.get(parent, 0) + 1
    ports = set()
    for address, count in bridge_children.items():
        bridge = by_address.get(address)
        if bridge is None or not _is_pci_bridge(bridge):
            continue
        if parent_of.get(address) is not None and count >= 1:
            ports.add(address)
    return ports


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
    localities: dict[str, Locality] = {}
    devices: list[PciDevice] = []
    # Parents come before children when sorted by path depth.
    for function in sorted(functions, key=lambda f: (len(f.ancestors), f.address)):
        parent = function.ancestors[-1] if function.ancestors else None
        locality = resolve_locality(function, localities.get(parent) if parent else None, nodes, online, notes)
        localities[function.address] = locality
        chain = collapse_chain(function.ancestors, upstream_ports)
        switch = next((a for a in reversed(function.ancestors) if a in upstream_ports), None)
        if function.address in upstream_ports:
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
