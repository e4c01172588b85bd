"""udev as the hot-plug signal: a udev monitor for add/remove/change/bind/unbind/move on
pci, infiniband, net and nvme whose bursts (one hot-plug is a dozen events) collapse into
one rebuild request. udev as a second witness of the PCI tree (the cross-check against
sysfs discovery) is topod.discover.udev_check.

Only on the live root ('/'): a captured host tree has no udev; there udev is not used and
the status says so. The debouncer is pure; only the functions marked "shell" touch
pyudev, which is imported on first use so `import topod.discover.udev` stays cheap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from topod.errors import ConfigError
from topod.host import HostRoot
from topod.sysnames import is_pci_address

WATCH_SUBSYSTEMS = ("pci", "infiniband", "net", "nvme")
RELEVANT_ACTIONS = frozenset({"add", "remove", "change", "move", "bind", "unbind"})
NOT_LIVE = "udev: not used for non-live root"


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


# ---------------------------------------------------------------- pure core


def nearest_pci_address(sys_path: str) -> str | None:
    for part in reversed([p for p in sys_path.split("/") if p]):
        if is_pci_address(part):
            return part.lower()
    return None


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


def load_pyudev() -> Any:
    import pyudev  # lazy: only the live daemon and `--root /` commands need libudev

    return pyudev


class UdevWatcher:
    """Shell: a started udev monitor. For an asyncio loop: add_reader(fileno(), ...) and
    call drain(), then take_due()/deadline(); or just await wait_for_change()."""

    def __init__(self, settings: UdevSettings = UdevSettings(), *, context: Any = None,
                 subsystems: Iterable[str] = WATCH_SUBSYSTEMS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        pyudev = load_pyudev()
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
