"""Opening a file for writing beneath a root, following no link anywhere below it.

Where a write lands is decided here, once: `open_beneath(root_fd, "proc/irq/5/x")`
opens the file only if every component below the root is a real directory and the last
a regular file with one link. A symlink anywhere below the root (a directory or the file
itself), a `..` that would climb out, a FIFO, a socket, a device or a hard-linked file is
refused with an OSError whose errno says which: ELOOP (a link), EXDEV (out of the root),
ENXIO (a FIFO with no reader, or not a regular file), EMLINK (more than one hard link:
another name of the file may lie outside the root, and a write through this one would
change it). Nothing blocks: the open is O_NONBLOCK, so a FIFO never waits for a reader.
A refused file is left as it was: O_TRUNC waits until the descriptor has passed the
checks (then ftruncate).

Linux 5.6+ does it in one call, openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS), reached through libc's syscall() (number 437 on x86_64 and
aarch64, the only architectures asked). Where the kernel lacks it (ENOSYS, or a
seccomp filter answering EPERM/ENOSYS) the path is walked one component at a time with
O_DIRECTORY | O_NOFOLLOW, the file opened with O_NOFOLLOW | O_NONBLOCK. Either way the
opened descriptor is fstat'ed (the file opened, not a path looked up again, so nothing
can be swapped in between): a regular file with one link, or nothing (procfs and sysfs
files are regular, with one link).
"""

from __future__ import annotations

import errno
import os
import platform
import stat

# openat2(2) flags (linux/openat2.h).
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())

WRITE_FLAGS = os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# Answers that mean "no openat2 here" (a kernel before 5.6, or a seccomp filter): walk instead.
_NO_OPENAT2 = (errno.ENOSYS, errno.EPERM)

_openat2_state: dict[str, object] = {}


def _syscall():  # noqa: ANN202 - a ctypes function, or None
    if "fn" not in _openat2_state:
        fn = None
        if SYS_OPENAT2 is not None:
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                fn = libc.syscall
                fn.restype = ctypes.c_long
            except (OSError, AttributeError):
                fn = None
        _openat2_state["fn"] = fn
        _openat2_state["available"] = fn is not None
    return _openat2_state["fn"] if _openat2_state["available"] else None


def _openat2(dir_fd: int, rel: str, flags: int) -> int | None:
    """The descriptor, or None when openat2 is not available (the caller walks)."""
    fn = _syscall()
    if fn is None:
        return None
    import ctypes

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    how = OpenHow(flags, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    fd = fn(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(rel)),
            ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd >= 0:
        return int(fd)
    code = ctypes.get_errno()
    if code in _NO_OPENAT2:
        _openat2_state["available"] = False  # the kernel will not change its mind
        return None
    raise OSError(code, os.strerror(code), rel)


def _components(rel: str) -> list[str]:
    parts = [part for part in rel.split("/") if part and part != "."]
    if not parts:
        raise OSError(errno.EISDIR, "no file named below the root", rel)
    if ".." in parts:
        raise OSError(errno.EXDEV, "'..' is not followed below the root", rel)
    if any("\0" in part for part in parts):
        raise OSError(errno.EINVAL, "path holds a NUL byte", rel)
    return parts


def _walk(dir_fd: int, parts: list[str], flags: int, rel: str) -> int:
    """openat2's promise by hand: each directory opened with O_NOFOLLOW from the last."""
    current = dir_fd
    try:
        for part in parts[:-1]:
            try:
                following = os.open(part, _DIR_FLAGS, dir_fd=current)
            except OSError as exc:
                # O_NOFOLLOW|O_DIRECTORY on a link: ELOOP or ENOTDIR, by kernel; call it a link
                code = errno.ELOOP if exc.errno == errno.ENOTDIR and _is_link(part, current) else exc.errno
                raise OSError(code, os.strerror(code), rel) from None
            if current != dir_fd:
                os.close(current)
            current = following
        try:
            return os.open(parts[-1], flags, dir_fd=current)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, rel) from None
    finally:
        if current != dir_fd:
            os.close(current)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def open_beneath(dir_fd: int, rel: str, flags: int = WRITE_FLAGS, *, use_openat2: bool = True) -> int:
    """A descriptor for the regular file `rel` below the directory `dir_fd`, opened with
    `flags` and no link followed; OSError otherwise (see the module's docstring)."""
    parts = _components(rel)
    # O_TRUNC at open would empty a hard-linked file before fstat could refuse it.
    opening = flags & ~os.O_TRUNC
    fd = _openat2(dir_fd, "/".join(parts), opening) if use_openat2 else None
    if fd is None:
        fd = _walk(dir_fd, parts, opening, rel)
    try:
        found = os.fstat(fd)
        _check_writable_here(found, rel)
        if flags & os.O_TRUNC and found.st_size:  # procfs files say 0: nothing to cut
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_writable_here(found: os.stat_result, rel: str) -> None:
    """A write may land only in a regular file whose one name is the one below the root."""
    if not stat.S_ISREG(found.st_mode):
        raise OSError(errno.ENXIO, f"not a regular file ({_kind(found.st_mode)}); not written", rel)
    if found.st_nlink > 1:
        raise OSError(errno.EMLINK, f"a file with {found.st_nlink} hard links (another of its names may lie "
                                    "outside the root); not written", rel)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def write_beneath(root: str, rel: str, data: bytes, *, use_openat2: bool = True) -> None:
    """Write `data` to the regular file `rel` below `root` in one write(), no link
    followed, never blocking. OSError names what refused it."""
    root_fd = os.open(root or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = open_beneath(root_fd, rel, use_openat2=use_openat2)
    finally:
        os.close(root_fd)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", rel)
    finally:
        os.close(fd)
