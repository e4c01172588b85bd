"""udev as a second witness of the PCI tree, and as the hot-plug signal.

Two jobs, both only on the live root ('/'):
- cross-check: enumerate pci/infiniband/net/nvme/drm through libudev (pyudev) and compare
  with what sysfs discovery found; every disagreement is a `udev_mismatch` finding.
- watch: a udev monitor for add/remove/change/bind/unbind/move on pci, infiniband, net and
  nvme whose bursts (one hot-plug is a dozen events) collapse into one rebuild request.

A captured host tree has no udev; there udev is not used and the status says so.
The comparison and the debouncer are pure; only the functions marked "shell" touch
pyudev, which is imported on first use so `import topod.discover.udev` stays cheap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from topod.discover.devnames import is_virtio_dir
from topod.discover.pci import CHILD_NAME_DIRS
from topod.errors import ConfigError
from topod.host import HostRoot
from topod.model import HostWarning, PciDevice, Topology
from topod.sysnames import is_pci_address

WATCH_SUBSYSTEMS = ("pci", "infiniband", "net", "nvme")
# Children discovery records in PciDevice.names live in <function>/<dir>/<name>; the
# kernel names each dir after its class, so these are also the udev subsystems to list.
CHILD_SUBSYSTEMS = (*CHILD_NAME_DIRS, "block")  # block: virtio-blk and direct block/ children
RELEVANT_ACTIONS = frozenset({"add", "remove", "change", "move", "bind", "unbind"})
NOT_LIVE = "udev: not used for non-live root"
MISMATCH = "udev_mismatch"


@dataclass(frozen=True, slots=True)
class UdevSettings:
    """[udev] in topod.toml."""

    enabled: bool = True
    source: str = "udev"  # "udev" (after udevd rules) or "kernel" (raw uevents, no udevd)
    quiet_s: float = 0.5  # a burst is over after this long without events
    max_delay_s: float = 5.0  # a never-ending burst still yields a rebuild this often

    def __post_init__(self) -> None:
        if self.source not in ("udev", "kernel"):
            raise ConfigError(f"[udev] source = {self.source!r}: must be \"udev\" or \"kernel\"")
        if not 0 <= self.quiet_s <= self.max_delay_s:
            raise ConfigError(f"[udev] needs 0 <= quiet_s <= max_delay_s; got quiet_s = {self.quiet_s}, "
                              f"max_delay_s = {self.max_delay_s}")


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
class UdevEvent:
    action: str
    subsystem: str
    sys_path: str
    address: str | None  # nearest PCI function in sys_path, None for virtual devices


@dataclass(frozen=True, slots=True)
class RebuildRequest:
    """One debounced burst of udev events: the daemon rebuilds the Topology once."""

    events: int
    actions: tuple[str, ...]
    addresses: tuple[str, ...]
    first_at: float
    last_at: float

    def to_json(self) -> dict[str, object]:
        return {"events": self.events, "actions": list(self.actions), "addresses": list(self.addresses),
                "first_at": self.first_at, "last_at": self.last_at}


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


def nearest_pci_address(sys_path: str) -> str | None:
    for part in reversed([p for p in sys_path.split("/") if p]):
        if is_pci_address(part):
            return part.lower()
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


class ChangeDebouncer:
    """Collects events; a batch is due `quiet_s` after its last event, or `max_delay_s`
    after its first when events never stop. Time is passed in, so it is tested pure."""

    def __init__(self, quiet_s: float = 0.5, max_delay_s: float = 5.0) -> None:
        if quiet_s < 0 or max_delay_s < quiet_s:
            raise ValueError(f"udev debounce: need 0 <= quiet_s <= max_delay_s, got {quiet_s}, {max_delay_s}")
        self.quiet_s = quiet_s
        self.max_delay_s = max_delay_s
        self._reset()

    def _reset(self) -> None:
        self._count = 0
        self._actions: set[str] = set()
        self._addresses: set[str] = set()
        self._first: float | None = None
        self._last: float | None = None

    def add(self, events: Iterable[UdevEvent], now: float) -> None:
        for event in events:
            if event.action not in RELEVANT_ACTIONS:
                continue
            self._count += 1
            self._actions.add(event.action)
            if event.address:
                self._addresses.add(event.address)
            if self._first is None:
                self._first = now
            self._last = now

    def deadline(self) -> float | None:
        """When the pending batch becomes due; None when nothing is pending."""
        if self._first is None or self._last is None:
            return None
        return min(self._last + self.quiet_s, self._first + self.max_delay_s)

    def take(self, now: float) -> RebuildRequest | None:
        due = self.deadline()
        if due is None or now < due or self._first is None or self._last is None:
            return None
        request = RebuildRequest(self._count, tuple(sorted(self._actions)), tuple(sorted(self._addresses)),
                                 self._first, self._last)
        self._reset()
        return request


# ---------------------------------------------------------------- pyudev shell


def _pyudev() -> Any:
    import pyudev  # lazy: only the live daemon and `--root /` commands need libudev

    return pyudev


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
    pyudev = _pyudev()
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


class UdevWatcher:
    """Shell: a started udev monitor. For an asyncio loop: add_reader(fileno(), ...) and
    call drain(), then take_due()/deadline(); or just await wait_for_change()."""

    def __init__(self, settings: UdevSettings = UdevSettings(), *, context: Any = None,
                 subsystems: Iterable[str] = WATCH_SUBSYSTEMS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        pyudev = _pyudev()
        self._monitor = pyudev.Monitor.from_netlink(context if context is not None else pyudev.Context(),
                                                    source=settings.source)
        self.subsystems = tuple(subsystems)
        for subsystem in self.subsystems:
            self._monitor.filter_by(subsystem)
        self._monitor.start()
        self._debouncer = ChangeDebouncer(settings.quiet_s, settings.max_delay_s)
        self._clock = clock
        self.source = settings.source

    def fileno(self) -> int:
        return self._monitor.fileno()

    def drain(self) -> list[UdevEvent]:
        """Every event ready now, without blocking; they also join the pending batch."""
        events = []
        while (device := self._monitor.poll(timeout=0)) is not None:
            events.append(UdevEvent(device.action or "", device.subsystem or "", device.sys_path,
                                    nearest_pci_address(device.sys_path)))
        self._debouncer.add(events, self._clock())
        return events

    def deadline(self) -> float | None:
        return self._debouncer.deadline()

    def take_due(self) -> RebuildRequest | None:
        return self._debouncer.take(self._clock())

    async def wait_for_change(self, timeout: float | None = None) -> RebuildRequest | None:
        """The next debounced burst, or None when `timeout` seconds pass without one due."""
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        end = None if timeout is None else self._clock() + timeout
        loop.add_reader(self.fileno(), readable.set)
        try:
            while True:
                readable.clear()
                self.drain()
                request = self.take_due()
                if request is not None:
                    return request
                now = self._clock()
                if end is not None and now >= end:
                    return None
                waits = [t - now for t in (self.deadline(), end) if t is not None]
                try:
                    async with asyncio.timeout(max(0.0, min(waits)) if waits else None):
                        await readable.wait()
                except TimeoutError:
                    pass
        finally:
            loop.remove_reader(self.fileno())

    async def watch(self, on_change: Callable[[RebuildRequest], Awaitable[None] | None]) -> None:
        """Call on_change once per burst until cancelled (the daemon's udev task)."""
        while True:
            request = await self.wait_for_change()
            if request is not None:
                result = on_change(request)
                if result is not None:
                    await result

    def close(self) -> None:
        """Drop the monitor (remove_reader first). pyudev closes the netlink socket when
        the monitor is collected; it has no close() of its own."""
        self._monitor = None  # type: ignore[assignment]


def start_watcher(host: HostRoot, settings: UdevSettings = UdevSettings()) -> tuple[UdevWatcher | None, str]:
    """Shell: (watcher, status) on the live root; (None, why not) otherwise."""
    if not settings.enabled:
        return None, "udev: disabled by [udev] enabled = false"
    if not host.is_live:
        return None, NOT_LIVE
    try:
        watcher = UdevWatcher(settings)
    except (ImportError, OSError, ValueError) as exc:
        return None, f"udev: unavailable ({type(exc).__name__}: {exc}); hot-plug is not watched"
    return watcher, f"udev: watching {', '.join(watcher.subsystems)} (source {settings.source})"
