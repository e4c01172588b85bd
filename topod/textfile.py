"""Reading an operator's file (the config, a probe table) as the daemon must: only a
regular file is opened (a FIFO would block the start or a reload for ever, /dev/zero never
ends, a device can act when opened), at most `limit` bytes, decoded as UTF-8 whatever the
locale. Every failure is one ConfigError naming the file.

Host trees have their own reader (topod.host); a command-line tool reading a file its
user named (process substitution gives a pipe) opens it plainly."""

from __future__ import annotations

import os
import stat

from topod.cappedread import file_kind, read_capped
from topod.errors import ConfigError

_DEV_NULL = os.makedev(1, 3)


def read_text_file(path: str, limit: int, what: str = "") -> str:
    """The file's text, or ConfigError. `what` prefixes the path in messages ("link table")."""
    name = f"{what} {path}" if what else str(path)
    try:
        before = os.stat(path)
        if stat.S_ISCHR(before.st_mode) and before.st_rdev == _DEV_NULL:
            return ""  # `--config /dev/null`: the usual way to say "nothing", read as empty
        if not stat.S_ISREG(before.st_mode):
            raise ConfigError(f"{name}: not a regular file ({file_kind(before.st_mode)}); not read")
        if before.st_size > limit:
            raise ConfigError(f"{name}: {before.st_size} bytes, over the {limit}-byte limit; not read")
        data = _read_opened(path, name, before, limit)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not UTF-8: invalid byte 0x{data[exc.start]:02x} at offset {exc.start}") from None


def _read_opened(path: str, name: str, before: os.stat_result, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(opened.st_mode):
            raise ConfigError(f"{name}: replaced while being opened; not read")
        data = read_capped(fd, opened.st_size, limit)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after the stat
        raise ConfigError(f"{name}: over the {limit}-byte limit; not read")
    return data

