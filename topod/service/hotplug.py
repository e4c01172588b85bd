"""Hot-plug: udev events on a live root trigger a rediscovery; captured trees have none."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from topod.host import HostRoot

log = structlog.get_logger("topod")


class HotplugSource:
    def __init__(self, host: HostRoot) -> None:
        self.host = host
        self.watcher = None
        self.mode = "periodic rescan only"

    def start(self, on_change: Callable[[], None]) -> None:
        if not self.host.is_live:
            self.mode = "udev: not used for non-live root (periodic rescan only)"
            log.info("hotplug_source", mode=self.mode)
            return
        try:
            from topod.discover.udev import UdevWatcher

            self.watcher = UdevWatcher()
            self.watcher.start()
            fd = self.watcher.fileno()
        except Exception as exc:  # noqa: BLE001 - no udev (containers): say so, keep rescanning
            self.watcher = None
            self.mode = f"udev unavailable ({exc}); periodic rescan only"
            log.warning("hotplug_source", mode=self.mode)
            return

        def readable() -> None:
            if self.watcher is not None and self.watcher.drain():
                on_change()

        asyncio.get_running_loop().add_reader(fd, readable)
        self.mode = "udev"
        log.info("hotplug_source", mode=self.mode)

    def stop(self) -> None:
        if self.watcher is None:
            return
        try:
            asyncio.get_running_loop().remove_reader(self.watcher.fileno())
        except (RuntimeError, ValueError, OSError):
            pass
        self.watcher = None
