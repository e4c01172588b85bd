"""The host root: the one object through which topod reads and writes the host.

Every path below /sys, /proc, /dev and /run/udev goes through a HostRoot, so the
daemon and its tests run just as well against a captured host tree as against `/`.

Reads are defensive, because a host tree may be hostile (a captured tree from anywhere,
or a live /sys with odd drivers): only regular files are opened (a FIFO, socket, device
or directory is refused before it is opened, by a stat or by its directory listing's entry
type; one swapped in after that look is refused unread, by an fstat of what was opened),
every read is capped in size, and a read that fails for any reason other than "not
there" is recorded as a ReadProblem that discovery turns into a Topology warning.
`read()` answers None for any failure; `read_bytes()` is the strict form that raises a
HostReadError subclass saying which. The caps and those subclasses are
topod.cappedread's; the path arithmetic without pathlib, topod.pathtext's.
"""

from __future__ import annotations

import errno
import os
import stat
from _thread import _local as thread_local  # threading.local, without importing threading (~1 ms a topoctl start)
from collections import deque
from collections.abc import Callable

TYPE_CHECKING = False  # annotations only: pathlib is imported where a Path is made
if TYPE_CHECKING:
    from pathlib import Path

from topod.cappedread import (
    CAPS_BY_PATH,
    MISSING_ERRNOS,
    NAME_SUFFIXES,
    READ_CAP,
    file_kind,
    os_read_error,
    read_cap,
    read_capped,
    read_error,
)
from topod.errors import (
    HostFileMissingError,
    HostFileTooLargeError,
    HostFileUnreadableError,
    HostReadError,
    HostWriteError,
    NotAHostTreeError,
    NotARegularFileError,
)
from topod.pathtext import path_text, realpath_memo
from topod.record import record

# A write hook gets (relative path, text) and may raise OSError to simulate what a
# kernel answers (EIO for a managed IRQ, ENOSPC for exhausted vectors, ...).
WriteFault = Callable[[str, str], None]

# How many recent read problems a HostRoot keeps (a daemon's reads never grow it further).
PROBLEMS_KEPT = 256

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC


@record
class ReadProblem:
    """A host file that is there but could not be read; code is the warning code
    (permission_denied, not_a_regular_file, file_too_large, read_error)."""

    code: str
    path: str  # relative to the root
    reason: str


class _Collecting:
    """HostRoot.collecting_problems' block (a class: contextlib is ~0.5 ms of a topoctl
    start, and nothing else on the `topo` path needs it)."""

    def __init__(self, stack: list[list[ReadProblem]]) -> None:
        self._stack = stack
        self._problems: list[ReadProblem] = []

    def __enter__(self) -> list[ReadProblem]:
        self._stack.append(self._problems)
        return self._problems

    def __exit__(self, *exc_info: object) -> None:
        self._stack.pop()


class HostRoot:
    """Reads (and, for /proc/irq, writes) files relative to one root directory."""

    def __init__(self, root: str | os.PathLike[str] = "/", *, check: bool = True) -> None:
        self.root_text = path_text(root)  # str(Path(root)); pathlib itself is imported on use
        self._prefix = self.root_text.rstrip("/")  # string paths: pathlib costs 15 us a join
        self._root: Path | None = None
        self.write_fault: WriteFault | None = None
        # The most recent read problems, for any reader; discovery collects its own.
        self.read_problems: deque[ReadProblem] = deque(maxlen=PROBLEMS_KEPT)
        self._collectors = thread_local()
        self._real_root: str | None = None
        if check:
            self._check_is_host_tree()

    @property
    def root(self) -> Path:
        if self._root is None:
            from pathlib import Path

            self._root = Path(self.root_text)
        return self._root

    @property
    def is_live(self) -> bool:
        return self.real_root == "/"

    @property
    def real_root(self) -> str:
        """The root with every link followed (computed once)."""
        if self._real_root is None:
            self._real_root = os.path.realpath(self._prefix or "/")
        return self._real_root

    def _check_is_host_tree(self) -> None:
        root = self.root_text
        if not os.path.isdir(root):
            raise NotAHostTreeError(f"--root {root}: no such directory")
        if not os.path.isdir(f"{self._prefix}/sys/devices/system/cpu") and not os.path.isdir(f"{self._prefix}/proc"):
            raise NotAHostTreeError(
                f"--root {root}: not a host tree (expected sys/devices/system/cpu or proc/ inside it)"
            )

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")  # a Path for callers that want one; reads use _str

    def _str(self, rel: str) -> str:
        return f"{self._prefix}/{rel.lstrip('/')}"

    # ------------------------------------------------------------------ problems

    def collecting_problems(self) -> _Collecting:
        """A context manager: within its block, read problems of this thread are also
        appended to the list it yields (discovery turns them into warnings)."""
        stack: list[list[ReadProblem]] | None = getattr(self._collectors, "stack", None)
        if stack is None:
            stack = self._collectors.stack = []
        return _Collecting(stack)

    def _record(self, error: HostReadError) -> None:
        problem = ReadProblem(error.code, error.path, error.reason)  # type: ignore[attr-defined]
        self.read_problems.append(problem)
        for problems in getattr(self._collectors, "stack", ()):
            problems.append(problem)

    # ------------------------------------------------------------------ reads

    def read_bytes(self, rel: str, *, limit: int | None = None) -> bytes:
        """The file's bytes. Raises HostFileMissingError, HostPermissionError,
        NotARegularFileError, HostFileTooLargeError (over `limit`, default read_cap(rel))
        or HostFileUnreadableError. Never opens anything but a regular file, never reads
        more than the cap, never blocks on a FIFO."""
        data = self._load(rel.lstrip("/"), limit)
        if data is None:
            raise read_error(HostFileMissingError, rel.lstrip("/"), os.strerror(errno.ENOENT))
        return data

    def _load(self, rel: str, limit: int | None, dir_fd: int | None = None, name: str = "",
              listed_regular: bool = False) -> bytes | None:
        """read_bytes, with None for a missing file (discovery asks for many: no exception).
        With dir_fd, the file is `name` in that open directory (rel names it in errors);
        listed_regular: that directory's listing said the entry is a regular file."""
        path = f"{self._prefix}/{rel}" if dir_fd is None else name
        if limit is not None:
            cap = limit
        elif rel.endswith(NAME_SUFFIXES):
            cap = read_cap(rel)
        else:
            cap = CAPS_BY_PATH.get(rel, READ_CAP)
        # Opening a FIFO blocks and opening a device can act (a watchdog arms itself):
        # neither is ever opened. What an entry is, is known before opening it, from a
        # stat, or from the directory listing's own entry type (then the open follows no
        # link, so it opens the entry that was listed or fails).
        before = None
        if not listed_regular:
            try:
                before = os.stat(path, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno in MISSING_ERRNOS:
                    return None
                raise os_read_error(rel, exc) from None
            except ValueError:  # a NUL in the path
                raise read_error(HostFileUnreadableError, rel, "path holds a NUL byte") from None
            if not stat.S_ISREG(before.st_mode):
                raise read_error(NotARegularFileError, rel,
                                 f"{file_kind(before.st_mode)} where a file was expected; not read")
            if before.st_size > cap:
                raise read_error(HostFileTooLargeError, rel,
                                 f"{before.st_size} bytes, over the {cap}-byte cap; not read")
        try:
            fd = os.open(path, _OPEN_FLAGS if before is not None else _OPEN_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in MISSING_ERRNOS:
                return None
            if before is None and exc.errno == errno.ELOOP:  # a link now, not the file listed: look again
                return self._load(rel, limit, dir_fd, name)
            raise os_read_error(rel, exc) from None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (
                    before is not None and (opened.st_ino != before.st_ino or opened.st_dev != before.st_dev)):
                raise read_error(NotARegularFileError, rel, "replaced by something else while opening; not read")
            if before is None and opened.st_size > cap:
                raise read_error(HostFileTooLargeError, rel,
                                 f"{opened.st_size} bytes, over the {cap}-byte cap; not read")
            data = read_capped(fd, opened.st_size, cap)
        except OSError as exc:
            raise os_read_error(rel, exc) from None
        finally:
            os.close(fd)
        if len(data) > cap:
            raise read_error(HostFileTooLargeError, rel, f"more than the {cap}-byte cap; not read")
        return data

    def read_data(self, rel: str, *, limit: int | None = None) -> bytes | None:
        """The file's bytes, or None when it cannot be read. A missing file is silent;
        any other failure is recorded in read_problems (and any collecting_problems)."""
        try:
            return self._load(rel.lstrip("/"), limit)
        except HostReadError as exc:
            self._record(exc)
            return None

    def read(self, rel: str, *, limit: int | None = None) -> str | None:
        """The file's text (UTF-8, bad bytes replaced), or None as read_data says."""
        data = self.read_data(rel, limit=limit)
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_line(self, rel: str) -> str | None:
        text = self.read(rel)
        return None if text is None else text.strip()

    def open_dir(self, rel: str) -> HostDir | None:
        """A directory opened once, to read many files in it by name (a PCI function's
        attributes); None when it is missing or not a directory (recorded when it is
        there but unreadable). Close it, or use it as a context manager."""
        rel = rel.strip("/")
        try:
            fd = os.open(f"{self._prefix}/{rel}", _DIR_FLAGS)
        except OSError as exc:
            if exc.errno not in MISSING_ERRNOS:
                self._record(os_read_error(rel, exc))
            return None
        except ValueError:
            return None
        return HostDir(self, rel, fd)

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self._str(rel))

    def is_dir(self, rel: str) -> bool:
        return os.path.isdir(self._str(rel))

    def listdir(self, rel: str) -> list[str]:
        """Entry names, sorted; empty when the directory is missing (and recorded when it
        is there but unreadable)."""
        try:
            return sorted(os.listdir(self._str(rel)))
        except OSError as exc:
            if exc.errno not in MISSING_ERRNOS:
                self._record(os_read_error(rel.lstrip("/"), exc))
            return []
        except ValueError:
            return []

    def readlink(self, rel: str) -> str | None:
        try:
            return os.readlink(self._str(rel))
        except (OSError, ValueError):
            return None

    def resolve(self, rel: str, memo: dict[str, str] | None = None) -> str | None:
        """The path of rel after following links, relative to the root; None when it dangles,
        loops or leaves the root. With a memo (a dict the caller keeps for one pass over
        an unchanging tree) the directories many paths share are looked at once."""
        try:
            if memo is None:
                real = os.path.realpath(self._str(rel), strict=True)
            else:
                path = self._str(rel)
                real = realpath_memo(path if path.startswith("/") else f"{os.getcwd()}/{path}", memo, 0)
        except (OSError, ValueError, RuntimeError):
            return None
        root = self.real_root
        if root == "/":
            return real
        if real.startswith(root) and real[len(root) : len(root) + 1] == "/":
            return real[len(root) :]
        return "/" if real == root else None

    def write(self, rel: str, text: str) -> None:
        """Write text to a host file; the only way topod changes the host. The write
        follows no link below the root and opens only a regular file, never blocking
        (topod.beneath); a refusal is a HostWriteError with the errno (ELOOP, EXDEV, ENXIO)."""
        if self.write_fault is not None:
            try:
                self.write_fault(rel, text)
            except OSError as exc:
                raise HostWriteError(rel, exc.errno or errno.EIO, os.strerror(exc.errno or errno.EIO)) from exc
        from topod.beneath import write_beneath

        try:
            write_beneath(self._prefix or "/", rel, text.encode("ascii"))
        except OSError as exc:
            code = exc.errno or errno.EIO
            reason = {errno.ELOOP: "a symbolic link below the root; not followed, not written",
                      errno.EXDEV: "outside the root; not written"}.get(code, exc.strerror or os.strerror(code))
            raise HostWriteError(rel, code, reason) from exc


class HostDir:
    """One directory under a HostRoot, open: files in it are read by name without looking
    the directory's path up again; the same checks, caps and problem records as
    HostRoot.read."""

    __slots__ = ("host", "rel", "fd", "regular")

    def __init__(self, host: HostRoot, rel: str, fd: int) -> None:
        self.host, self.rel, self.fd = host, rel, fd
        self.regular: frozenset[str] = frozenset()  # entries the listing typed as regular files

    def read(self, name: str) -> str | None:
        rel = f"{self.rel}/{name}"
        try:
            data = self.host._load(rel, None, self.fd, name, name in self.regular)
        except HostReadError as exc:
            self.host._record(exc)
            return None
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_line(self, name: str) -> str | None:
        text = self.read(name)
        return None if text is None else text.strip()

    def listdir(self) -> list[str]:
        """The directory's entry names, sorted (empty when it cannot be listed). The
        listing's entry types are kept: a file it calls regular is read with no stat first
        (a rescan reads three in each of ~60 PCI functions)."""
        names: list[str] = []
        regular: list[str] = []
        try:
            with os.scandir(self.fd) as entries:
                for entry in entries:
                    names.append(entry.name)
                    if entry.is_file(follow_symlinks=False):  # d_type; an lstat only where it is unknown
                        regular.append(entry.name)
        except OSError as exc:
            self.host._record(os_read_error(self.rel, exc))
            return []
        self.regular = frozenset(regular)
        return sorted(names)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> HostDir:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
