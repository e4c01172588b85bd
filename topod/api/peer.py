"""Who is calling: SO_PEERCRED on the Unix socket, and what that caller may do.

Group membership comes from the name service (getpwuid + getgrouplist), which on HPC
nodes is LDAP/SSSD and can block for seconds: it is looked up in a worker thread and
cached per (uid, gid) for GROUP_CACHE_SECONDS (3 s), one lookup in flight per key. The
cache is short because it is a grant: a user removed from the group keeps what the cache
says for that long at most. A reload (SIGHUP, `topoctl reload`) flushes it at once.
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import socket
import struct
import time
from dataclasses import dataclass

from topod.errors import TopodError

_UCRED = struct.Struct("3i")
# Long enough that a burst of requests from one user costs one name-service lookup,
# short enough that a removal from the group takes effect before anyone relies on it.
GROUP_CACHE_SECONDS = 3.0
GROUP_CACHE_ENTRIES = 4096


class PeerDeniedError(TopodError):
    """The peer's credentials cannot be read (not a Unix socket, or the kernel refused)."""

    code = "permission_denied"


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


def peer_uid(transport) -> int | None:  # noqa: ANN001 - an asyncio transport, or None
    """The uid at the other end of a transport's Unix socket; None when it cannot be read
    (not a Unix socket, no transport): such a peer counts as an ordinary user."""
    try:
        return peer_credentials(transport.get_extra_info("socket") if transport is not None else None)[1]
    except (OSError, ValueError):
        return None


def group_id(name: str | None) -> int | None:
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def caller_from(pid: int | None, uid: int, gid: int, allowed_group: int | None) -> Caller:
    """Root, the daemon's own user and members of the configured group may allocate;
    administrative operations are root-only. Blocking: the async API uses caller_async."""
    may = uid == 0 or uid == os.getuid()
    if not may and allowed_group is not None:
        may = gid == allowed_group or allowed_group in _groups_of(uid, gid)
    return Caller(uid=uid, gid=gid, pid=pid, may_allocate=may, is_admin=uid == 0)


async def caller_async(pid: int | None, uid: int, gid: int, allowed_group: int | None,
                       cache: GroupCache | None = None) -> Caller:
    """caller_from without blocking the loop: the group lookup runs in a thread, cached."""
    known = caller_now(pid, uid, gid, allowed_group, cache)
    if known is not None:
        return known
    may = allowed_group in await (cache or GROUPS).groups(uid, gid)
    return Caller(uid=uid, gid=gid, pid=pid, may_allocate=may, is_admin=uid == 0)


def caller_now(pid: int | None, uid: int, gid: int, allowed_group: int | None,
               cache: GroupCache | None = None) -> Caller | None:
    """The caller when no group lookup is needed (root, topod's own user, the primary
    group, or the cache holds the user's groups); None when one is (caller_async)."""
    may = uid == 0 or uid == os.getuid()
    if not may and allowed_group is not None:
        if gid == allowed_group:
            may = True
        else:
            groups = (cache or GROUPS).cached(uid, gid)
            if groups is None:
                return None
            may = allowed_group in groups
    return Caller(uid=uid, gid=gid, pid=pid, may_allocate=may, is_admin=uid == 0)


class GroupCache:
    """(uid, gid) -> the groups of that user, for `ttl` seconds; misses run in a thread.
    clear() forgets every answer, and a lookup in flight when it is called is not kept
    (it may have read the name service before the change clear() was called for)."""

    def __init__(self, ttl: float = GROUP_CACHE_SECONDS, entries: int = GROUP_CACHE_ENTRIES,
                 lookup=None, clock=time.monotonic) -> None:
        self.ttl = ttl
        self.entries = entries
        self.lookup = lookup
        self.clock = clock
        self._cache: dict[tuple[int, int], tuple[float, frozenset[int]]] = {}
        self._pending: dict[tuple[int, int], asyncio.Future] = {}
        self._generation = 0  # clear() counts up: a lookup started before it is not cached
        self.lookups = 0

    def cached(self, uid: int, gid: int) -> frozenset[int] | None:
        """The user's groups if a lookup younger than `ttl` holds them; None otherwise."""
        hit = self._cache.get((uid, gid))
        if hit is not None and self.clock() - hit[0] < self.ttl:
            return hit[1]
        return None

    async def groups(self, uid: int, gid: int) -> frozenset[int]:
        key = (uid, gid)
        hit = self.cached(uid, gid)
        if hit is not None:
            return hit
        # One lookup per key at a time, owned by no request: a caller that disconnects
        # (and is cancelled) does not cancel the lookup others wait on.
        task = self._pending.get(key)
        if task is None:
            task = asyncio.ensure_future(self._lookup(key))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "unretrieved"
            self._pending[key] = task
        return await asyncio.shield(task)

    async def _lookup(self, key: tuple[int, int]) -> frozenset[int]:
        generation = self._generation
        task = asyncio.current_task()
        try:
            self.lookups += 1
            groups = frozenset(await asyncio.to_thread(self.lookup or _groups_of, *key))
            if generation == self._generation:
                if len(self._cache) >= self.entries:
                    self._cache.clear()
                self._cache[key] = (self.clock(), groups)
            return groups
        finally:
            if self._pending.get(key) is task:
                del self._pending[key]

    def clear(self) -> None:
        """Forget every user's groups (a reload: the group may have changed): the next
        request of each user looks them up again, and lookups in flight are not kept."""
        self._generation += 1
        self._cache.clear()
        self._pending.clear()


GROUPS = GroupCache()


def _groups_of(uid: int, gid: int) -> list[int]:
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except (KeyError, OSError):  # unknown user, or the name service failed: only the primary group
        return [gid]
