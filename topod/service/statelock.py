"""One daemon per state directory: an advisory lock (flock) on `topod.lock` in it, held
for the daemon's life. The kernel drops it when the process ends, kill -9 included, so a
stale file never blocks a start. A second daemon on the same directory would share the
lease database and fail later on constraint errors; it stops at once instead, naming the
holder's pid (StateDirBusyError: topod exits EX_TEMPFAIL, 75, which systemd retries,
as the other daemon may be on its way out)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from topod.errors import ConfigError, TopodError

LOCK_NAME = "topod.lock"


class StateDirBusyError(TopodError):
    """Another topod holds the state directory: temporary (it may be stopping), not a
    configuration error."""

    code = "state_dir_busy"


class StateDirLock:
    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def acquire(cls, state_dir: str) -> StateDirLock | None:
        """The lock, or None when the directory cannot be made or opened (the lease store
        then says why, in its own words). ConfigError when another process holds it."""
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError:
            return None
        if not os.path.isdir(state_dir):
            return None
        path = os.path.join(state_dir, LOCK_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot open the state directory's lock {path}: "
                              f"{'a link' if exc.errno == errno.ELOOP else exc.strerror or exc}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"the state directory's lock {path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                who = f"pid {holder}" if holder else "another process"
                raise StateDirBusyError(f"state directory {state_dir} is in use by another topod ({who} holds {path}); "
                                  "one daemon per state directory: stop it, or give this one another --state-dir"
                                  ) from None
            raise ConfigError(f"cannot lock {path}: {exc.strerror or exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdecimal() else None
