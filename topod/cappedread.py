"""A capped read of one file, and what a failed one is called: the most bytes topod reads
from each host file (READ_CAP, and caps by path and by name), a read of an open file
that stops one byte past its cap, the words for what a non-regular file is, and the
HostReadError subclass an OSError becomes.

Its own module because these rules hold for whoever reads: HostRoot (topod.host) reads
the host tree by them, and an operator's file (topod.textfile) or the lease database's
own file checks (topod.service.lease_db) use them with no host root at all.
"""

from __future__ import annotations

import errno
import os
import stat

from topod.errors import HostFileMissingError, HostFileUnreadableError, HostPermissionError, HostReadError

MiB = 1024 * 1024
# The default cap on one read. Every sysfs attribute is one page (4 KiB) at most.
READ_CAP = 1 * MiB
# Files that grow with the CPU or IRQ count get their own caps. Measured: /proc/interrupts
# in the kernel's format ("%10u " per CPU) with 4,096 CPU columns, 200 IRQ lines and the
# 20 x86 summary lines is 9,973,086 bytes (9.5 MiB); 64 MiB holds ~1,450 IRQ lines at
# 4,096 CPUs. /proc/cpuinfo is ~2 KiB per CPU on x86 (the flags line), ~8 MiB at 4,096.
CAPS_BY_PATH: dict[str, int] = {
    "proc/interrupts": 64 * MiB,
    "proc/cpuinfo": 32 * MiB,
    "proc/softirqs": 8 * MiB,
    "proc/stat": 8 * MiB,
}
# By file name, anywhere: a process's numa_maps has one line per mapping (65,530 at most).
CAPS_BY_NAME: dict[str, int] = {"numa_maps": 16 * MiB}

MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR)  # "not there": a missing file, never a problem
_DENIED = (errno.EACCES, errno.EPERM)
_CHUNK = 65536

NAME_SUFFIXES = tuple(f"/{name}" for name in CAPS_BY_NAME)  # a path ending in one has a cap by name


def read_cap(rel: str) -> int:
    """The most bytes topod reads from the file at rel (relative to the root)."""
    rel = rel.lstrip("/")
    if rel.endswith(NAME_SUFFIXES):
        return CAPS_BY_NAME[rel.rsplit("/", 1)[-1]]
    return CAPS_BY_PATH.get(rel, READ_CAP)


def read_capped(fd: int, size_hint: int, cap: int) -> bytes:
    """An open file's bytes, at most cap + 1 of them (one more than allowed: the caller
    tells "over the cap" without reading the rest). sysfs says 4096 and procfs 0 for
    every file, so the size is known only by reading; a file on disk that gave exactly
    its size is whole (one read, not two)."""
    first = os.read(fd, min(cap + 1, max(size_hint + 1, 8192)))
    if not first or len(first) > cap or len(first) == size_hint:
        return first
    chunks = [first]
    total = len(first)
    while chunk := os.read(fd, min(_CHUNK, cap + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            break
    return b"".join(chunks) if len(chunks) > 1 else first


def file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def read_error(cls: type[HostReadError], rel: str, reason: str) -> HostReadError:
    error = cls(f"{rel}: {reason}")
    error.path = rel  # type: ignore[attr-defined]
    error.reason = reason  # type: ignore[attr-defined]
    return error


def os_read_error(rel: str, exc: OSError) -> HostReadError:
    code = exc.errno or errno.EIO
    reason = os.strerror(code)
    if code in MISSING_ERRNOS:
        return read_error(HostFileMissingError, rel, reason)
    if code in _DENIED:
        return read_error(HostPermissionError, rel, f"{reason}; run as root or make it readable")
    return read_error(HostFileUnreadableError, rel, f"{reason} (errno {errno.errorcode.get(code, code)})")
