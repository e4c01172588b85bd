"""Watch lease owners' processes with pidfds: the lease ends the moment the owner exits."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


def process_start_time(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - gone, or not ours to see: unknown either way
        return None


class OwnerWatch:
    def __init__(self, on_exit: Callable[[str], None]) -> None:
        self.on_exit = on_exit
        self._fds: dict[str, int] = {}

    def watch(self, lease_id: str, pid: int) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (tests of the pure parts): reap() covers it
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError):
            loop.call_soon(self.on_exit, lease_id)
            return
        self._fds[lease_id] = fd
        loop.add_reader(fd, self._exited, lease_id)

    def _exited(self, lease_id: str) -> None:
        self.unwatch(lease_id)
        self.on_exit(lease_id)

    def unwatch(self, lease_id: str) -> None:
        fd = self._fds.pop(lease_id, None)
        if fd is None:
            return
        try:
            asyncio.get_running_loop().remove_reader(fd)
        except RuntimeError:
            pass
        os.close(fd)

    def close(self) -> None:
        for lease_id in list(self._fds):
            self.unwatch(lease_id)
