"""Admission to the API: how many connections the daemon serves at once, and whose.

- at most `[api] max_connections` connections at once (and never more than the
  descriptor limit minus a reserve); one more gets a 503 `too_many_connections` and is
  closed at once (its descriptor is freed in the same step: a Unix socket peer still reads
  what was written before the close);
- fair shares: one uid holds at most `[api] max_connections_per_uid` connections, and
  the last `[api] root_reserved_connections` are root's alone, so no user, nor all users
  together, can lock root (or the daemon's own checks) out;
- accept() failing for want of descriptors (EMFILE/ENFILE/ENOBUFS/ENOMEM) is logged once
  per burst with a count, never a traceback per attempt; asyncio retries the accept;
- requests that are not HTTP topod can parse are counted and logged at most once per 10 s.

The listening socket and the protocol that applies this: topod.service.server.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from typing import Any

import structlog

log = structlog.get_logger("topod")

# A refused connection lingers (reading and dropping what the client sends until its EOF,
# at most REFUSAL_LINGER_SECONDS) so that the client reads the 503 and then a clean end,
# not ECONNRESET (Linux resets an AF_UNIX peer when a socket closes with unread input).
# At most LINGER_BUDGET linger at once: beyond that (a flood) each is closed at once.
REFUSAL_LINGER_SECONDS = 0.5
LINGER_BUDGET = 16
# asyncio accepts up to ACCEPT_BATCH connections per turn of the loop, and a connection
# holds its descriptor for ACCEPT_PIPELINE turns before a refusal frees it (accepted; its
# transport made by a task; connection_made; connection_lost, which closes it): under a
# flood that many batches are open at once, beside the admitted connections.
ACCEPT_BATCH = 8
ACCEPT_PIPELINE = 4
# Descriptors kept free for everything but admitted API connections: the lease database,
# /proc and /sys reads, pidfds of lease owners, netlink, the journal, metrics, NVML (32),
# the refused connections lingering, and the accept pipeline's connections in flight.
# (Before: 64 with batches of 16; a flood at nofile 128 met EMFILE in about half the runs.)
RESERVED_DESCRIPTORS = 32 + LINGER_BUDGET + ACCEPT_PIPELINE * ACCEPT_BATCH
ACCEPT_RESOURCE_MESSAGE = "socket.accept() out of system resource"


def descriptor_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_ceiling(configured: int, nofile: int | None) -> int:
    """[api] max_connections, lowered to fit under the descriptor limit."""
    if nofile is None:
        return max(1, configured)
    return max(1, min(configured, nofile - RESERVED_DESCRIPTORS))


def refusal(code: str, message: str, status: str = "503 Service Unavailable") -> bytes:
    body = json.dumps({"code": code, "message": message}).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n").encode() + body


LOG_EVERY_SECONDS = 10.0


REFUSALS_SHOWN_SECONDS = 60.0  # health stays degraded this long after a refusal


class ConnectionGate:
    """Counts open API connections, in all and per uid; refuses beyond the ceiling, beyond
    a uid's share, and (for anyone but root) into root's reserve; rate-limits accept errors."""

    def __init__(self, limit: Any, nofile: int | None = None, clock=time.monotonic,
                 per_uid: Any = None, root_reserve: Any = 0) -> None:
        # limit, per_uid, root_reserve: ints, or callables giving the configured value
        # (they follow a reload); per_uid None: no per-uid share
        self._limit = limit
        self._per_uid = per_uid
        self._root_reserve = root_reserve
        self.nofile = nofile
        self.clock = clock
        self.active = 0
        self.refused = 0
        self.by_uid: dict[int | None, int] = {}
        self.lingering = 0  # refused connections waiting for their client's EOF
        self.last_refusal: tuple[float, str] | None = None  # (when, why)
        self._recent: list[float] = []  # refusal times within REFUSALS_SHOWN_SECONDS
        self.accept_failures = 0  # since start
        self._burst = 0  # failures in the current burst (0: none in progress)
        self._burst_started = 0.0
        self._burst_logged = False
        self.malformed = 0  # requests aiohttp could not parse, since start
        # Under a flood each kind of trouble is logged once per LOG_EVERY_SECONDS, with a count.
        self._last_logged = {kind: -1e9 for kind in ("refused", "accept_failed", "malformed")}

    @property
    def ceiling(self) -> int:
        configured = self._limit() if callable(self._limit) else self._limit
        return connection_ceiling(int(configured), self.nofile)

    def admit(self, uid: int | None = None) -> bool:
        """uid: the peer's (SO_PEERCRED), None when unknown (then it is counted as a user)."""
        self.accepted()
        why = self._refusal(uid)
        if why is not None:
            self.refused += 1
            now = self.clock()
            self.last_refusal = (now, why)
            self._recent = [t for t in self._recent if now - t < REFUSALS_SHOWN_SECONDS][-999:] + [now]
            if self._due("refused"):
                log.warning("connection_refused", reason=why, uid=uid, active=self.active,
                            active_for_uid=self.by_uid.get(uid, 0), max_connections=self.ceiling,
                            refused_total=self.refused)
            return False
        self.active += 1
        self.by_uid[uid] = self.by_uid.get(uid, 0) + 1
        return True

    def _refusal(self, uid: int | None) -> str | None:
        ceiling = self.ceiling
        if self.active >= ceiling:
            return "too_many_connections"
        if uid == 0:
            return None
        reserve = min(_value(self._root_reserve), ceiling - 1)
        if self.active >= ceiling - reserve:
            return "root_reserve"
        share = _value(self._per_uid)
        if share is not None and self.by_uid.get(uid, 0) >= share:
            return "uid_share"
        return None

    def leave(self, uid: int | None = None) -> None:
        self.active = max(0, self.active - 1)
        count = self.by_uid.get(uid, 0) - 1
        if count > 0:
            self.by_uid[uid] = count
        else:
            self.by_uid.pop(uid, None)

    def refused_recently(self) -> str | None:
        """A line for health while refusals are recent (REFUSALS_SHOWN_SECONDS), else None."""
        if self.last_refusal is None:
            return None
        now = self.clock()
        recent = sum(1 for t in self._recent if now - t < REFUSALS_SHOWN_SECONDS)
        if not recent:
            return None
        return (f"API connections refused: {recent} in the last {REFUSALS_SHOWN_SECONDS:g} s "
                f"(last: {self.last_refusal[1]}; [api] max_connections, max_connections_per_uid, "
                "root_reserved_connections)")

    def accepted(self) -> None:
        """An accept() succeeded: a burst of failures, if any, is over."""
        if self._burst:
            if self._burst_logged:
                log.info("accept_recovered", failures=self._burst,
                         seconds=round(self.clock() - self._burst_started, 3),
                         accept_failures_total=self.accept_failures, active=self.active)
            self._burst = 0

    def accept_failed(self, exc: BaseException | None) -> None:
        """asyncio stops accepting for a second after each failure and retries; under a
        flood bursts follow each other, so at most one burst is logged per 10 s."""
        self.accept_failures += 1
        if not self._burst:
            self._burst_started = self.clock()
            self._burst_logged = self._due("accept_failed")
            if self._burst_logged:
                log.warning("accept_failed", error=_errno_name(exc), active=self.active,
                            max_connections=self.ceiling, descriptor_limit=self.nofile,
                            accept_failures_total=self.accept_failures,
                            note="asyncio retries every second; logged at most once per 10 s")
        self._burst += 1

    def malformed_request(self, status: int, reason: str) -> None:
        """A request that was not HTTP topod can parse. One line per 10 s under a flood:
        the log must not grow with what a client sends."""
        self.malformed += 1
        if self._due("malformed"):
            log.warning("http_request_malformed", status=status, reason=reason, malformed_total=self.malformed,
                        note="logged at most once per 10 s")

    def _due(self, kind: str) -> bool:
        """True (and the clock restarted) when `kind` was last logged LOG_EVERY_SECONDS ago."""
        now = self.clock()
        if now - self._last_logged[kind] < LOG_EVERY_SECONDS:
            return False
        self._last_logged[kind] = now
        return True

    def exception_handler(self, previous):
        """A loop exception handler: accept() resource errors are counted here, the rest
        go to `previous` (or asyncio's default)."""

        def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
            if context.get("message") == ACCEPT_RESOURCE_MESSAGE:
                self.accept_failed(context.get("exception"))
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        return handle


def _value(setting: Any) -> Any:
    return setting() if callable(setting) else setting


def _errno_name(exc: BaseException | None) -> str:
    import errno

    number = getattr(exc, "errno", None)
    return errno.errorcode.get(number, str(exc)) if number is not None else str(exc)


REFUSALS = {
    "too_many_connections": refusal("too_many_connections", "the daemon serves its maximum of concurrent "
                                                            "connections ([api] max_connections); retry shortly"),
    "root_reserve": refusal("too_many_connections", "the remaining connections are reserved for root "
                                                    "([api] root_reserved_connections); retry shortly"),
    "uid_share": refusal("too_many_connections", "this user holds its share of connections "
                                                 "([api] max_connections_per_uid); close one and retry"),
}
REFUSAL = REFUSALS["too_many_connections"]
