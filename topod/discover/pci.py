"""PCI functions as sysfs lists them: each function's identity, link, locality as
firmware states it, interrupts and children (RawFunction). How they make a tree:
topod.discover.pcitree."""

from __future__ import annotations

from topod.cpulist import CpuListRangeError, parse_cpulist, parse_cpumask
from topod.discover.devnames import nested_child_names
from topod.discover.memo import DiscoveryMemo, PciIdentity, directory_stamp
from topod.discover.notes import Notes
from topod.host import HostDir, HostRoot
from topod.discover.rdma import read_rdma_ports
from topod.model import PciLink, RdmaPort
from topod.record import field, record
from topod.sysnames import is_host_bridge, is_pci_address

BUS_DIR = "sys/bus/pci/devices"

CHILD_NAME_DIRS = ("net", "infiniband", "nvme", "drm")


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
