"""Path strings as the standard library computes them, computed for less: path_text is
str(pathlib.PurePosixPath(path)) without importing pathlib, realpath_memo is
os.path.realpath(path, strict=True) remembering what each prefix resolved to.

Its own module because neither knows about a host root: HostRoot (topod.host) uses them
to name its root and to resolve a path below it (HostRoot.resolve).
"""

from __future__ import annotations

import errno
import os
import stat


def path_text(path: str | os.PathLike[str]) -> str:
    """str(pathlib.PurePosixPath(path)), without importing pathlib (with the urllib.parse
    and ipaddress it pulls in, ~5 ms of every topoctl start): empty and '.' parts dropped,
    '..' kept, a leading '//' kept as POSIX allows, '.' for nothing."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"expected a str path, not {type(text).__name__}")
    if text.startswith("//") and not text.startswith("///"):
        lead = "//"
    else:
        lead = "/" if text.startswith("/") else ""
    parts = [part for part in text.split("/") if part and part != "."]
    return lead + "/".join(parts) if lead or parts else "."


_MAX_LINK_DEPTH = 40  # the kernel's limit on nested symbolic links


def realpath_memo(path: str, memo: dict[str, str], depth: int) -> str:
    """os.path.realpath(path, strict=True) for an absolute path, remembering
    what each prefix resolved to in memo. Raises OSError (ENOENT, ENOTDIR, ELOOP)."""
    if depth > _MAX_LINK_DEPTH:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
    result = "/"
    for name in path.split("/"):
        if not name or name == ".":
            continue
        if name == "..":
            result = os.path.dirname(result)
            continue
        candidate = f"{result}/{name}" if result != "/" else f"/{name}"
        known = memo.get(candidate)
        if known is None:
            if stat.S_ISLNK(os.lstat(candidate).st_mode):
                target = os.readlink(candidate)
                known = realpath_memo(f"{result}/{target}" if not target.startswith("/") else target, memo, depth + 1)
            else:
                known = candidate
            memo[candidate] = known
        result = known
    return result
