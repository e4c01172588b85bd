"""Who is calling: SO_PEERCRED on the Unix socket, and what that caller may do."""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass

_UCRED = struct.Struct("3i")


@dataclass(frozen=True, slots=True)
class Caller:
    uid: int
    gid: int
    pid: int | None
    may_allocate: bool
    is_admin: bool


def peer_credentials(sock: socket.socket | None) -> tuple[int | None, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    if sock is None or sock.family != socket.AF_UNIX:
        raise PermissionError("not a Unix socket peer")
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(data)
    return (pid or None), uid, gid


def group_id(name: str | None) -> int | None:
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def caller_from(pid: int | None, uid: int, gid: int, allowed_group: int | None) -> Caller:
    """Root, the daemon's own user and members of the configured group may allocate;
    administrative operations are root-only."""
    may = uid == 0 or uid == os.getuid()
    if not may and allowed_group is not None:
        may = gid == allowed_group or allowed_group in _groups_of(uid, gid)
    return Caller(uid=uid, gid=gid, pid=pid, may_allocate=may, is_admin=uid == 0)


def _groups_of(uid: int, gid: int) -> list[int]:
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]
