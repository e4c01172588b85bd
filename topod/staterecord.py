"""A small JSON record in the state directory that must survive a crash (what topod
changed on the host, so it can be given back): written whole (temporary file, fsync,
rename), never through a link, readable by topod alone; removed when there is nothing
left to record. A record that cannot be read is treated as absent by its caller's rule."""

from __future__ import annotations

import json
import os


def load_record(path: str) -> object | None:
    """The record's JSON, or None when there is none; OSError/ValueError when it exists
    but cannot be read or parsed (the caller decides what that means)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def save_record(path: str, body: object | None) -> None:
    """Write `body` durably over the record at `path`; None removes the record."""
    if body is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    temp = f"{path}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(body, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
