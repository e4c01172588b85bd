"""The host root: the one object through which topod reads and writes the host.

Every path below /sys, /proc, /dev and /run/udev goes through a HostRoot, so the
daemon and its tests run just as well against a captured host tree as against `/`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from topod.errors import HostWriteError, NotAHostTreeError

# A write hook gets (relative path, text) and may raise OSError to simulate what a
# kernel answers (EIO for a managed IRQ, ENOSPC for exhausted vectors, ...).
WriteFault = Callable[[str, str], None]


class HostRoot:
    """Reads (and, for /proc/irq, writes) files relative to one root directory."""

    def __init__(self, root: str | os.PathLike[str] = "/", *, check: bool = True) -> None:
        self.root = Path(root)
        self._prefix = str(self.root).rstrip("/")  # string paths: pathlib costs 15 us a join
        self.write_fault: WriteFault | None = None
        if check:
            self._check_is_host_tree()

    @property
    def is_live(self) -> bool:
        return self.root.resolve() == Path("/")

    def _check_is_host_tree(self) -> None:
        if not self.root.is_dir():
            raise NotAHostTreeError(f"--root {self.root}: no such directory")
        if not (self.root / "sys/devices/system/cpu").is_dir() and not (self.root / "proc").is_dir():
            raise NotAHostTreeError(
                f"--root {self.root}: not a host tree (expected sys/devices/system/cpu or proc/ inside it)"
            )

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def _str(self, rel: str) -> str:
        return f"{self._prefix}/{rel.lstrip('/')}"

    def read(self, rel: str) -> str | None:
        """The file's text, or None when it is missing or unreadable."""
        try:
            fd = os.open(self._str(rel), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError):
            return None
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", errors="replace")

    def read_line(self, rel: str) -> str | None:
        text = self.read(rel)
        return None if text is None else text.strip()

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self._str(rel))

    def is_dir(self, rel: str) -> bool:
        return os.path.isdir(self._str(rel))

    def listdir(self, rel: str) -> list[str]:
        """Entry names, sorted; empty when the directory is missing."""
        try:
            return sorted(os.listdir(self._str(rel)))
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        try:
            return os.readlink(self._str(rel))
        except OSError:
            return None

    def resolve(self, rel: str) -> str | None:
        """The path of rel after following links, relative to the root; None when it dangles
        or leaves the root."""
        target = self.path(rel)
        try:
            real = target.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        root = self.root.resolve()
        try:
            return "/" + str(real.relative_to(root))
        except ValueError:
            return None

    def write(self, rel: str, text: str) -> None:
        """Write text to a host file; the only way topod changes the host."""
        if self.write_fault is not None:
            try:
                self.write_fault(rel, text)
            except OSError as exc:
                raise HostWriteError(rel, exc.errno or errno.EIO, os.strerror(exc.errno or errno.EIO)) from exc
        try:
            with open(self.path(rel), "w", encoding="ascii") as handle:
                handle.write(text)
        except OSError as exc:
            code = exc.errno or errno.EIO
            raise HostWriteError(rel, code, os.strerror(code)) from exc
