"""What makes the daemon rediscover: debounced udev bursts on a live root (the watcher of
topod.discover.udev and the cross-check of topod.discover.udev_check, the same code the
umockdev tests run), else the rescan interval alone. A discovery on a live root is
cross-checked against udev."""

from __future__ import annotations

import asyncio

import structlog

from topod.discover import discover
from topod.discover.memo import DiscoveryMemo
from topod.discover.udev import RebuildRequest, UdevSettings, start_watcher
from topod.host import HostRoot
from topod.model import Topology
from topod.record import replace

log = structlog.get_logger("topod")


def udev_settings(section: dict) -> UdevSettings:
    return UdevSettings(enabled=bool(section["enabled"]), source=str(section["source"]),
                        quiet_s=float(section["quiet_seconds"]), max_delay_s=float(section["max_delay_seconds"]))


class HotplugSource:
    def __init__(self, host: HostRoot, settings: UdevSettings) -> None:
        self.host = host
        self.watcher, self.mode = start_watcher(host, settings)
        self.active = self.watcher is not None
        self.last_burst: RebuildRequest | None = None
        log.info("hotplug_source", mode=self.mode, active=self.active)

    async def next_change(self, timeout: float) -> RebuildRequest | None:
        """The next debounced udev burst, or None once `timeout` seconds pass."""
        if self.watcher is None:
            await asyncio.sleep(timeout)
            return None
        burst = await self.watcher.wait_for_change(timeout)
        if burst is not None:
            self.last_burst = burst
        return burst

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None

    def to_json(self) -> dict[str, object]:
        return {"active": self.active, "mode": self.mode,
                "last_burst": self.last_burst.to_json() if self.last_burst else None}


def discover_checked(host: HostRoot, memo: DiscoveryMemo | None = None) -> Topology:
    """Discovery, plus udev's view of the PCI tree on a live root (mismatches become
    warnings). Blocking: the daemon runs it in a worker thread, one pass at a time (the
    memo is not shared between threads)."""
    topology = discover(host, memo=memo)
    if not host.is_live:
        return topology
    # Only a live root is checked: a captured tree's daemon never loads the check.
    from topod.discover.udev_check import cross_check

    check = cross_check(host, topology)
    if check.findings:
        topology = replace(topology, warnings=topology.warnings + tuple(check.findings))
    return topology
