"""The software watchdog: systemd's WatchdogSec= is only worth having if the ping
means "every loop is making progress", not merely "the event loop is alive".

Each background loop registers with a deadline and beats after each step; the
Supervisor is pure bookkeeping over monotonic times passed in (or read from its
clock). `run_watchdog` is the thin asyncio shell: it pings WATCHDOG=1 only while
every loop is within its deadline and names the stalled loops in STATUS= otherwise,
so systemd restarts a daemon whose IRQ loop hangs even though its API still answers.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LoopState:
    name: str
    deadline: float  # seconds a loop may go without a beat
    last_beat: float  # monotonic seconds


@dataclass(frozen=True, slots=True)
class LoopFailure:
    failures: int  # iterations that raised since start
    streak: int  # of them in a row, up to now (0: the last iteration succeeded)
    last_error: str
    last_failed: float  # monotonic seconds


class Supervisor:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._loops: dict[str, LoopState] = {}
        self._failures: dict[str, LoopFailure] = {}
        self._tokens: dict[str, int] = {}
        self._reported: dict[str, float] = {}  # loop -> the last beat of the stall already reported

    def register(self, name: str, deadline: float, now: float | None = None) -> int:
        """Start watching `name`; it counts as having just beaten. Registering again
        (a restarted loop) replaces the deadline and restarts the clock. Returns a token
        for unregister, so a replaced loop's exit cannot unregister its successor."""
        if not name:
            raise ValueError("a watched loop needs a name")
        if not deadline > 0:  # also rejects NaN
            raise ValueError(f"watchdog deadline for loop {name!r} must be > 0 seconds, got {deadline!r}")
        self._loops[name] = LoopState(name, float(deadline), self._now(now))
        self._failures.pop(name, None)
        self._tokens[name] = token = self._tokens.get(name, 0) + 1
        return token

    def unregister(self, name: str, token: int | None = None) -> None:
        """A loop that ends on purpose stops being watched (unknown names are ignored);
        with a token, only if no newer registration replaced it."""
        if token is not None and self._tokens.get(name) != token:
            return
        self._loops.pop(name, None)
        self._failures.pop(name, None)

    def fail(self, name: str, error: str, now: float | None = None) -> bool:
        """An iteration of `name` raised. True when this starts a failure streak or the
        error differs from the last one: what deserves a log line (not every retry)."""
        previous = self._failures.get(name)
        streak = previous.streak + 1 if previous is not None else 1
        self._failures[name] = LoopFailure(
            failures=(previous.failures if previous else 0) + 1, streak=streak, last_error=error,
            last_failed=self._now(now))
        return streak == 1 or previous is None or previous.last_error != error

    def succeed(self, name: str) -> bool:
        """An iteration of `name` completed; True when it ends a failure streak."""
        previous = self._failures.get(name)
        if previous is None or previous.streak == 0:
            return False
        self._failures[name] = LoopFailure(previous.failures, 0, previous.last_error, previous.last_failed)
        return True

    def streak(self, name: str) -> int:
        """Failed iterations of `name` in a row, up to now."""
        failure = self._failures.get(name)
        return failure.streak if failure else 0

    def failing(self) -> dict[str, str]:
        """{loop: last error} for loops whose last iteration raised."""
        return {name: f.last_error for name, f in sorted(self._failures.items()) if f.streak > 0}

    def degraded_text(self) -> str | None:
        failing = self.failing()
        if not failing:
            return None
        return "degraded: " + "; ".join(f"{name} failing ({error})" for name, error in failing.items())

    def beat(self, name: str, now: float | None = None) -> None:
        state = self._loops.get(name)
        if state is None:
            raise KeyError(f"watchdog loop {name!r} beat before register(); registered: {sorted(self._loops)}")
        self._loops[name] = LoopState(name, state.deadline, self._now(now))

    def stalled(self, now: float | None = None) -> list[str]:
        """Names of loops past their deadline, sorted."""
        at = self._now(now)
        return sorted(s.name for s in self._loops.values() if at - s.last_beat > s.deadline)

    def newly_stalled(self, now: float | None = None) -> list[tuple[str, float, float]]:
        """(loop, seconds since its last beat, deadline) for each loop past its deadline
        whose stall has not been returned yet: once per stall; a loop that beats and
        stalls again is returned again."""
        at = self._now(now)
        out = []
        for state in self._loops.values():
            if at - state.last_beat > state.deadline and self._reported.get(state.name) != state.last_beat:
                self._reported[state.name] = state.last_beat
                out.append((state.name, at - state.last_beat, state.deadline))
        return sorted(out)

    def healthy(self, now: float | None = None) -> bool:
        return not self.stalled(now)

    def report(self, now: float | None = None) -> dict[str, dict[str, object]]:
        """JSON-ready per-loop view for /v1/health."""
        at = self._now(now)
        out: dict[str, dict[str, object]] = {}
        for s in sorted(self._loops.values(), key=lambda s: s.name):
            failure = self._failures.get(s.name)
            out[s.name] = {
                "deadline_seconds": s.deadline,
                "seconds_since_beat": round(max(at - s.last_beat, 0.0), 3),
                "healthy": at - s.last_beat <= s.deadline and (failure is None or failure.streak == 0),
                "stalled": at - s.last_beat > s.deadline,
                "failures": failure.failures if failure else 0,
                "failing": bool(failure and failure.streak),
                "last_error": failure.last_error if failure else None,
            }
        return out

    def stalled_text(self, now: float | None = None) -> str | None:
        """'stalled: irq (deadline 60s), probe (deadline 240s)', or None when healthy.
        Names and deadlines only, so the text changes when the set of stalled loops does."""
        names = self.stalled(now)
        if not names:
            return None
        return "stalled: " + ", ".join(f"{n} (deadline {self._loops[n].deadline:g}s)" for n in names)

    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else now


def watchdog_interval(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC, as sd_watchdog_enabled(3)
    advises), or None when systemd asked for none: WATCHDOG_USEC unset, or WATCHDOG_PID
    naming another process (a child that inherited our environment)."""
    env = os.environ if environ is None else environ
    raw_usec = env.get("WATCHDOG_USEC")
    if not raw_usec:
        return None
    raw_pid = env.get("WATCHDOG_PID")
    if raw_pid:
        try:
            watched = int(raw_pid)
        except ValueError:
            raise ValueError(f"WATCHDOG_PID={raw_pid!r} is not a process id") from None
        if watched != (os.getpid() if pid is None else pid):
            return None
    try:
        usec = int(raw_usec)
    except ValueError:
        raise ValueError(f"WATCHDOG_USEC={raw_usec!r} is not a whole number of microseconds") from None
    if usec <= 0:
        raise ValueError(f"WATCHDOG_USEC={raw_usec!r} must be > 0")
    return usec / 2 / 1_000_000


# Without WatchdogSec (no pings asked for), how often stalls are looked for and STATUS=
# refreshed: as often as the shipped unit's pings (WatchdogSec=30: every 15 s). The
# daemon's loop deadlines are 30 s or more (60 s by default), so a stall is still named
# within half its deadline, and an idle daemon is not woken every 5 s (each wake-up costs idle CPU).
IDLE_INTERVAL = 15.0


class _Notifier(Protocol):
    def watchdog(self) -> bool: ...
    def status(self, text: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Tick:
    ping: bool  # send WATCHDOG=1 now
    status: str  # what STATUS= should say


def watchdog_tick(supervisor: Supervisor, now: float, pinging: bool, healthy_status: str) -> Tick:
    """One decision of the watchdog loop (pure, for tests and for the daemon)."""
    stalled = supervisor.stalled_text(now)
    if stalled is not None:
        return Tick(ping=False, status=stalled)
    return Tick(ping=pinging, status=healthy_status)


async def run_watchdog(
    notifier: _Notifier,
    supervisor: Supervisor,
    interval: float | None,
    *,
    status_text: Callable[[], str] | None = None,
    idle_interval: float = IDLE_INTERVAL,
    on_stalled: Callable[[list[tuple[str, float, float]]], None] | None = None,
) -> None:
    """Run until cancelled. `interval`: seconds between pings (watchdog_interval()); None
    sends no pings but still reports stalls in STATUS= every `idle_interval` seconds.
    STATUS= is sent only when its text changes (status_text() while healthy).
    `on_stalled` hears each stall once (Supervisor.newly_stalled), to log where it hung."""
    period = interval if interval is not None else idle_interval
    if not period > 0:
        raise ValueError(f"watchdog interval must be > 0 seconds, got {period!r}")
    last_status: str | None = None
    while True:
        healthy_status = status_text() if status_text is not None else "running"
        now = supervisor.clock()
        tick = watchdog_tick(supervisor, now, interval is not None, healthy_status)
        if on_stalled is not None:
            stalled = supervisor.newly_stalled(now)
            if stalled:
                on_stalled(stalled)
        if tick.ping:
            notifier.watchdog()
        if tick.status != last_status:
            notifier.status(tick.status)
            last_status = tick.status
        await asyncio.sleep(period)
