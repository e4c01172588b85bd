"""udev as a second witness of the PCI tree: enumerate pci/infiniband/net/nvme/drm (and
block) through libudev (pyudev) and compare with what sysfs discovery found; every
disagreement is a `udev_mismatch` finding. Its own module because checking what was
discovered is a job apart from watching for hot-plug (topod.discover.udev, whose lazy
pyudev loader and NOT_LIVE status this shares). Only on the live root: a captured host
tree has no udev, and the status says so. The comparison is pure; only the functions
marked "shell" touch pyudev, imported on first use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from topod.discover.devnames import is_virtio_dir
from topod.discover.pci import CHILD_NAME_DIRS
from topod.discover.udev import NOT_LIVE, load_pyudev
from topod.host import HostRoot
from topod.model import HostWarning, PciDevice, Topology
from topod.sysnames import is_pci_address

# Children discovery records in PciDevice.names live in <function>/<dir>/<name>; the
# kernel names each dir after its class, so these are also the udev subsystems to list.
CHILD_SUBSYSTEMS = (*CHILD_NAME_DIRS, "block")  # block: virtio-blk and direct block/ children
MISMATCH = "udev_mismatch"


@dataclass(frozen=True, slots=True)
class UdevDevice:
    """One device as udev lists it. address: the PCI function itself (subsystem pci) or
    the function it hangs under directly as <function>/<subsystem>/<name>; else None."""

    subsystem: str
    sys_path: str
    sys_name: str
    address: str | None
    vendor: int | None = None
    device: int | None = None
    class_code: int | None = None
    driver: str | None = None
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class UdevCheck:
    used: bool
    status: str
    findings: tuple[HostWarning, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"used": self.used, "status": self.status, "findings": [f.to_json() for f in self.findings]}


# ---------------------------------------------------------------- pure core


def direct_pci_parent(sys_path: str, subsystem: str) -> str | None:
    """'/sys/devices/pci0000:17/0000:18:00.0/net/ib0', 'net' -> '0000:18:00.0'; None
    when the device is not laid out as <function>/<subsystem>/<name> (virtual, USB...)."""
    parts = [p for p in sys_path.split("/") if p]
    if len(parts) >= 3 and parts[-2] == subsystem and is_pci_address(parts[-3]):
        return parts[-3].lower()
    # virtio: <function>/virtioN/<subsystem>/<name> (discovery names these too)
    if len(parts) >= 4 and parts[-2] == subsystem and is_virtio_dir(parts[-3]) and is_pci_address(parts[-4]):
        return parts[-4].lower()
    return None


def parse_hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def parse_int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def compare(topology: Topology, devices: Iterable[UdevDevice]) -> tuple[HostWarning, ...]:
    """Every PCI function or child that one side lists and the other does not, and every
    PCI function whose ids, driver or numa_node differ between the two."""
    devices = list(devices)
    by_udev = {d.address: d for d in devices if d.subsystem == "pci" and d.address}
    by_sysfs = {d.address: d for d in topology.pci_devices}
    findings: list[HostWarning] = []
    for address in sorted(by_udev.keys() - by_sysfs.keys()):
        findings.append(HostWarning(MISMATCH, _pci_path(address), (
            f"udev lists PCI function {address} ({_describe_udev(by_udev[address])}) but sysfs discovery "
            f"did not find it{_discovery_note(topology, address)}")))
    for address in sorted(by_sysfs.keys() - by_udev.keys()):
        findings.append(HostWarning(MISMATCH, _pci_path(address), (
            f"sysfs discovery found PCI function {address} (kind {by_sysfs[address].kind}) "
            "but udev does not list it")))
    for address in sorted(by_udev.keys() & by_sysfs.keys()):
        diffs = field_differences(by_sysfs[address], by_udev[address])
        if diffs:
            findings.append(HostWarning(MISMATCH, _pci_path(address),
                                        f"PCI function {address}: " + "; ".join(diffs)))
    findings.extend(_child_mismatches(devices, by_sysfs, by_udev.keys() & by_sysfs.keys()))
    return tuple(findings)


def field_differences(sysfs: PciDevice, udev: UdevDevice) -> list[str]:
    pairs = (
        ("vendor", _hex(sysfs.vendor, 4), _hex(udev.vendor, 4)),
        ("device", _hex(sysfs.device, 4), _hex(udev.device, 4)),
        ("class", _hex(sysfs.class_code, 6), _hex(udev.class_code, 6)),
        ("driver", sysfs.driver, udev.driver),
        ("numa_node", sysfs.numa_node_raw, udev.numa_node),
    )
    return [f"{name} is {mine} in sysfs discovery but {theirs} in udev"
            for name, mine, theirs in pairs if mine != theirs]


def _child_mismatches(
    devices: list[UdevDevice], by_sysfs: dict[str, PciDevice], both: set[str]
) -> list[HostWarning]:
    # Children of a function only one side knows are already covered by that finding.
    udev_children = {(d.address, d.sys_name): d for d in devices
                     if d.subsystem != "pci" and d.address in both}
    sysfs_children = {(address, name) for address in both for name in by_sysfs[address].names}
    findings = []
    for key in sorted(udev_children.keys() - sysfs_children):
        child = udev_children[key]
        findings.append(HostWarning(MISMATCH, child.sys_path.lstrip("/"), (
            f"udev lists {child.subsystem} device {child.sys_name} under PCI function {child.address} "
            "but sysfs discovery did not record it")))
    for address, name in sorted(sysfs_children - udev_children.keys()):
        findings.append(HostWarning(MISMATCH, _pci_path(address), (
            f"sysfs discovery records {name} under PCI function {address} but udev lists no "
            f"{'/'.join(CHILD_SUBSYSTEMS)} device of that name there")))
    return findings


def _pci_path(address: str) -> str:
    return f"sys/bus/pci/devices/{address}"


def _describe_udev(device: UdevDevice) -> str:
    return (f"vendor {_hex(device.vendor, 4)} device {_hex(device.device, 4)} "
            f"class {_hex(device.class_code, 6)} driver {device.driver}")


def _discovery_note(topology: Topology, address: str) -> str:
    notes = [w for w in topology.warnings if address in w.path]
    return f"; discovery noted {notes[0].code}: {notes[0].reason}" if notes else ""


def _hex(value: int | None, width: int) -> str | None:
    return None if value is None else f"0x{value:0{width}x}"


# ---------------------------------------------------------------- pyudev shell


def _attribute(device: Any, name: str) -> str | None:
    try:
        value = device.attributes.get(name)
    except (KeyError, OSError, UnicodeDecodeError):
        return None
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text.strip() or None


def udev_device(device: Any) -> UdevDevice:
    """A pyudev Device as a plain value (shell: reads its attributes)."""
    subsystem = device.subsystem or ""
    sys_path = device.sys_path
    if subsystem != "pci":
        return UdevDevice(subsystem, sys_path, device.sys_name, direct_pci_parent(sys_path, subsystem))
    name = device.sys_name.lower()
    return UdevDevice(
        subsystem="pci",
        sys_path=sys_path,
        sys_name=name,
        address=name if is_pci_address(name) else None,
        vendor=parse_hex(_attribute(device, "vendor")),
        device=parse_hex(_attribute(device, "device")),
        class_code=parse_hex(_attribute(device, "class")),
        driver=device.driver,
        numa_node=parse_int(_attribute(device, "numa_node")),
    )


def enumerate_udev(context: Any = None, subsystems: Iterable[str] = ("pci", *CHILD_SUBSYSTEMS)) -> tuple[UdevDevice, ...]:
    """Shell: every device of these subsystems as libudev lists them, sorted by path."""
    pyudev = load_pyudev()
    context = context if context is not None else pyudev.Context()
    found: list[UdevDevice] = []
    for subsystem in dict.fromkeys(subsystems):
        for device in context.list_devices(subsystem=subsystem):
            found.append(udev_device(device))
    return tuple(sorted(found, key=lambda d: (d.sys_path, d.subsystem)))


def cross_check(host: HostRoot, topology: Topology, context: Any = None) -> UdevCheck:
    """Shell: compare the Topology sysfs discovery built with what udev lists. Off the
    live root, or when libudev cannot be loaded, says so instead of guessing."""
    if not host.is_live:
        return UdevCheck(False, NOT_LIVE)
    try:
        devices = enumerate_udev(context)
    except (ImportError, OSError) as exc:
        return UdevCheck(False, f"udev: unavailable ({type(exc).__name__}: {exc}); PCI tree not cross-checked")
    findings = compare(topology, devices)
    pci = sum(1 for d in devices if d.subsystem == "pci")
    return UdevCheck(True, f"udev: {pci} PCI functions and {len(devices) - pci} children cross-checked, "
                           f"{len(findings)} mismatch(es)", findings)
