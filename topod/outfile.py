"""An output file written whole or not at all: a temporary file beside it, renamed over
it once complete. A failure (a missing directory, a full disk) leaves no half file, and
the OSError names the file the user asked for, not the temporary one.

The temporary file is a fresh random name created exclusively, never a link followed.
Only a new name or an existing regular file is replaced so (a hard-linked one loses
this name's link; the file's other names keep their bytes). Anything else the user names
(a link, /dev/stdout, a FIFO, a device) is written through as it is: renaming over it
would swap a device node or a link for a plain file."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager

TYPE_CHECKING = False  # typing costs ~3 ms of a topoctl start; annotations are never evaluated
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import BinaryIO


@contextmanager
def replaced_whole(path: str) -> Iterator[BinaryIO]:
    """with replaced_whole("out.svg") as handle: handle.write(data)"""
    try:
        found = os.lstat(path)
    except OSError:
        found = None
    if found is not None and not stat.S_ISREG(found.st_mode):
        try:
            with open(path, "wb") as handle:
                yield handle
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None
        return
    # A fresh name, made here (O_EXCL) and never a link: a name planted beside the output
    # (a symlink or a hard link to another file, in a shared directory such as /tmp) fails
    # the open instead of being written through.
    temp = f"{path}.{os.urandom(6).hex()}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), path) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.replace(temp, path)
    except OSError as exc:
        _remove(temp)
        raise OSError(exc.errno, exc.strerror or str(exc), path) from None
    except BaseException:
        _remove(temp)
        raise


def _remove(temp: str) -> None:
    try:
        os.unlink(temp)
    except OSError:
        pass
