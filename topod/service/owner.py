"""Watch lease owners' processes with pidfds: the lease ends the moment the owner exits.

Only ESRCH from pidfd_open means the owner is gone. Any other failure (EMFILE at the
descriptor limit, ENOSYS before Linux 5.3 or under a seccomp filter, EPERM, ENOMEM) says
nothing about the owner: that lease is left to the reaper's once-a-second check (pid
alive with the recorded start time), and the first failure of each kind is logged.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable

import structlog

log = structlog.get_logger("topod")


def descends_from(pid: int, ancestor: int | None) -> bool:
    """Whether process `pid` is `ancestor` or one of its descendants (walking parents)."""
    if not ancestor:
        return False
    import psutil

    seen = 0
    while pid and seen < 4096:
        if pid == ancestor:
            return True
        try:
            pid = psutil.Process(pid).ppid()
        except (psutil.Error, OSError, ValueError, OverflowError):
            return False
        seen += 1
    return False


def process_exists(pid: int) -> bool:
    import psutil

    try:
        return psutil.pid_exists(pid)
    except (OverflowError, ValueError):
        return False


def process_start_time(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - gone, or not ours to see: unknown either way
        return None


class OwnerWatch:
    def __init__(self, on_exit: Callable[[str], None], pidfd_open: Callable[[int], int] = os.pidfd_open) -> None:
        self.on_exit = on_exit
        self._pidfd_open = pidfd_open
        self._fds: dict[str, int] = {}
        self.polled: set[str] = set()  # leases watched by the reaper's polling only
        self._logged: set[int] = set()  # errnos already logged

    def watch(self, lease_id: str, pid: int) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (tests of the pure parts): reap() covers it
        try:
            fd = self._pidfd_open(pid)
        except ProcessLookupError:
            loop.call_soon(self.on_exit, lease_id)
            return
        except OSError as exc:
            self.polled.add(lease_id)
            code = exc.errno or 0
            if code not in self._logged:
                self._logged.add(code)
                log.warning("owner_watch_polling", lease=lease_id, pid=pid, errno=errno.errorcode.get(code, code),
                            error=exc.strerror or str(exc),
                            fallback="the reaper checks the owner once a second (pid and start time)")
            return
        self._fds[lease_id] = fd
        loop.add_reader(fd, self._exited, lease_id)

    def _exited(self, lease_id: str) -> None:
        self.unwatch(lease_id)
        self.on_exit(lease_id)

    def unwatch(self, lease_id: str) -> None:
        self.polled.discard(lease_id)
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
