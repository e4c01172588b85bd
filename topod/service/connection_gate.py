"""Admission to the API: how many connections the daemon serves at once, and whose.

- at most `[api] max_connections` connections at once, and never more than the real
  descriptor limit (RLIMIT_NOFILE) leaves once the daemon's own descriptors (DescriptorBudget:
  database, WAL, journal, udev, IRQ worker, state files, NVML, worker threads, a margin) and
  the accept pipeline's are set aside; one more gets a 503 `too_many_connections` and is
  closed at once (its descriptor is freed in the same step: a Unix socket peer still reads
  what was written before the close); a limit too low for the configured connections is
  logged at start (`max_connections_lowered`) and keeps health degraded (`shortfall`);
- a reserve for root and the daemon's own uid: the last `[api] root_reserved_connections`
  are theirs alone, scaled down with the ceiling when the descriptor limit lowers it, but
  never below one, whatever the limit: no user, nor all users together, can lock root (or the daemon's own
  checks) out;
- fair shares: one uid holds at most `[api] max_connections_per_uid` connections, scaled
  down with the users' part of the ceiling when the descriptor limit lowers it, and never
  all of that part (UidShare): at least two uids can always hold connections;
- accept() failing for want of descriptors (EMFILE/ENFILE/ENOBUFS/ENOMEM) is logged once
  per burst with a count, never a traceback per attempt; asyncio retries the accept;
- requests that are not HTTP topod can parse are counted and logged at most once per 10 s.

The listening socket and the protocol that applies this: topod.service.server.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from dataclasses import dataclass
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
# The daemon's own descriptors, by use: what the descriptor limit must hold besides API
# connections. serve() counts the host's GPUs and asyncio's worker threads; the defaults
# (no GPU, DEFAULT_WORKERS threads) sum to 32, the reserve measured under floods before.
# (A daemon at rest on an 8-GPU fixture tree holds 14 descriptors, its IRQ worker 3 more.)
DEFAULT_WORKERS = 5
LINGER_SHARE = 4  # at most this fraction (1/4) of what is left may linger as refusals


def own_descriptors(gpus: int = 0, workers: int = DEFAULT_WORKERS) -> dict[str, int]:
    return {
        "standard streams and the log file": 3,
        "journal and sd_notify sockets": 2,
        "event loop (epoll, wake-up pipe)": 3,
        "API listener and the self-check's connection pair": 3,
        "metrics listener": 1,
        "lease database, its WAL, the state-directory lock": 3,
        "udev monitor": 1,
        "IRQ worker (process and pipes)": 3,
        "state files being written (NCCL, exports, isolation)": 2,
        "worker threads' /proc and /sys reads": workers,
        "NVML (/dev/nvidiactl, /dev/nvidia-uvm, one per GPU)": 2 + gpus,
        "pidfds of lease owners (one per GPU)": gpus,
        "margin": 4,
    }


def asyncio_workers() -> int:
    """The default executor's thread count (asyncio.to_thread), as CPython sizes it."""
    return min(32, (os.cpu_count() or 1) + 4)


DEFAULT_OWN_DESCRIPTORS = sum(own_descriptors().values())
ACCEPT_IN_FLIGHT = ACCEPT_PIPELINE * ACCEPT_BATCH
# Before, one constant: everything but API connections (the daemon's own, lingering
# refusals, the accept pipeline) at nofile 128.
RESERVED_DESCRIPTORS = DEFAULT_OWN_DESCRIPTORS + LINGER_BUDGET + ACCEPT_IN_FLIGHT
ACCEPT_RESOURCE_MESSAGE = "socket.accept() out of system resource"


@dataclass(frozen=True, slots=True)
class DescriptorBudget:
    """What a descriptor limit leaves for API connections: `nofile` less the daemon's own
    descriptors and the accept pipeline's connections in flight, less the refused
    connections allowed to linger (LINGER_BUDGET, fewer when little is left: lingering is
    a courtesy, a descriptor for root's connection is not). nofile None: no limit."""

    nofile: int | None
    own: int = DEFAULT_OWN_DESCRIPTORS
    in_flight: int = ACCEPT_IN_FLIGHT

    @property
    def _free(self) -> int:
        return (self.nofile or 0) - self.own - self.in_flight

    @property
    def linger(self) -> int:
        if self.nofile is None:
            return LINGER_BUDGET
        return min(LINGER_BUDGET, max(0, self._free // LINGER_SHARE))

    @property
    def connections(self) -> int | None:
        """API connections the limit has room for (may be 0 or less); None: no limit."""
        return None if self.nofile is None else self._free - self.linger

    def nofile_for(self, connections: int) -> int:
        """The descriptor limit that serves `connections` with the full linger budget."""
        return self.own + self.in_flight + LINGER_BUDGET + connections


def descriptor_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_ceiling(configured: int, nofile: int | None, own: int = DEFAULT_OWN_DESCRIPTORS) -> int:
    """[api] max_connections, lowered to fit under the descriptor limit; at least 1 (the
    reserve's: root's connection is served even when the limit leaves nothing else)."""
    room = DescriptorBudget(nofile, own).connections
    if room is None:
        return max(1, configured)
    return max(1, min(configured, room))


def reserved_slots(ceiling: int, configured_reserve: int, configured: int) -> int:
    """Root's (and the daemon's own uid's) part of the ceiling: [api] root_reserved_connections,
    scaled down in proportion when the descriptor limit lowers the ceiling below [api]
    max_connections (`configured`), lowered so that users keep one connection while the
    ceiling allows two, and never below one: whatever the limit, root has a connection."""
    scaled = configured_reserve * ceiling // max(1, configured)
    return max(1, min(scaled, ceiling - 1))


def uid_share(configured_share: int, users: int, configured_users: int) -> int:
    """One uid's share of the `users` connections (the ceiling less root's reserve): the
    configured share, scaled down in proportion when the descriptor limit lowers the
    ceiling below [api] max_connections (configured_users: the users' part when it does
    not), and never all of them while there are two: no single uid takes every slot."""
    scaled = users * configured_share // max(1, configured_users)
    return max(1, min(configured_share, scaled, users - 1))


def refusal(code: str, message: str, status: str = "503 Service Unavailable") -> bytes:
    body = json.dumps({"code": code, "message": message}).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n").encode() + body


LOG_EVERY_SECONDS = 10.0


REFUSALS_SHOWN_SECONDS = 60.0  # health stays degraded this long after a refusal


class ConnectionGate:
    """Counts open API connections, in all and per uid; refuses beyond the ceiling, beyond
    a uid's share, and (for anyone but root and the daemon's own uid) into their reserve;
    rate-limits accept errors."""

    def __init__(self, limit: Any, nofile: int | None = None, clock=time.monotonic,
                 per_uid: Any = None, root_reserve: Any = 0, own_descriptors: int = DEFAULT_OWN_DESCRIPTORS,
                 own_uid: int | None = None) -> None:
        # limit, per_uid, root_reserve: ints, or callables giving the configured value
        # (they follow a reload); per_uid None: no per-uid share. The reserve is at least
        # one whatever root_reserve says. own_uid: the daemon's (default: this process's).
        self._limit = limit
        self._per_uid = per_uid
        self._root_reserve = root_reserve
        self.nofile = nofile
        self.budget = DescriptorBudget(nofile, own_descriptors)
        self.privileged = frozenset({0, os.getuid() if own_uid is None else own_uid})
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
    def configured(self) -> int:
        return int(_value(self._limit))

    @property
    def ceiling(self) -> int:
        return connection_ceiling(self.configured, self.nofile, self.budget.own)

    @property
    def reserve(self) -> int:
        """Connections only root and the daemon's own uid may take (at least one)."""
        return reserved_slots(self.ceiling, int(_value(self._root_reserve)), self.configured)

    @property
    def share(self) -> int | None:
        """How many connections one uid (not root's, not the daemon's) may hold; None: no limit."""
        configured_share = _value(self._per_uid)
        if configured_share is None:
            return None
        ceiling, configured = self.ceiling, self.configured
        configured_reserve = int(_value(self._root_reserve))
        users = ceiling - reserved_slots(ceiling, configured_reserve, configured)
        configured_users = configured - reserved_slots(configured, configured_reserve, configured)
        return uid_share(int(configured_share), users, configured_users)

    @property
    def linger_budget(self) -> int:
        """Refused connections that may linger for their client's EOF at once."""
        return self.budget.linger

    def shortfall(self) -> str | None:
        """Why the descriptor limit cannot serve [api] max_connections (a line for health),
        or None when it can."""
        configured, ceiling = self.configured, self.ceiling
        if ceiling >= configured:
            return None
        users = ceiling - self.reserve
        for_users = f"{users} for users (at most {self.share} per uid)" if users > 0 else "none for users"
        return (f"descriptor limit {self.nofile} (RLIMIT_NOFILE) serves {ceiling} of [api] max_connections = "
                f"{configured} API connections: {self.reserve} kept for root, {for_users}; the daemon keeps "
                f"{self.budget.own} descriptors for itself and {self.budget.in_flight + self.budget.linger} for "
                f"accepts in flight and refusals; raise LimitNOFILE (ulimit -n) to at least "
                f"{self.budget.nofile_for(configured)}")

    def log_budget(self) -> None:
        """At start: the connections the descriptor limit allows, as a warning when they
        fall short of [api] max_connections (health says so too: shortfall)."""
        fields = {"configured": self.configured, "max_connections": self.ceiling,
                  "root_reserved": self.reserve, "per_uid": self.share, "descriptor_limit": self.nofile,
                  "own_descriptors": self.budget.own}
        problem = self.shortfall()
        if problem is not None:
            log.warning("max_connections_lowered", **fields, needed_descriptor_limit=self.budget.nofile_for(
                self.configured), reason=problem)

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
        if uid in self.privileged:
            return None
        if self.active >= ceiling - reserved_slots(ceiling, int(_value(self._root_reserve)), self.configured):
            return "root_reserve"
        held = self.by_uid.get(uid, 0)
        if held and held >= (self.share or held + 1):
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
