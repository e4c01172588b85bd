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


class Supervisor:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._loops: dict[str, LoopState] = {}

    def register(self, name: str, deadline: float, now: float | None = None) -> None:
        """Start watching `name`; it counts as having just beaten. Registering again
        (a restarted loop) replaces the deadline and restarts the clock."""
        if not name:
            raise ValueError("a watched loop needs a name")
        if not deadline > 0:  # also rejects NaN
            raise ValueError(f"watchdog deadline for loop {name!r} must be > 0 seconds, got {deadline!r}")
        self._loops[name] = LoopState(name, float(deadline), self._now(now))

    def unregister(self, name: str) -> None:
        """A loop that ends on purpose stops being watched (unknown names are ignored)."""
        self._loops.pop(name, None)

    def beat(self, name: str, now: float | None = None) -> None:
        state = self._loops.get(name)
        if state is None:
            raise KeyError(f"watchdog loop {name!r} beat before register(); registered: {sorted(self._loops)}")
        self._loops[name] = LoopState(name, state.deadline, self._now(now))

    def stalled(self, now: float | None = None) -> list[str]:
        """Names of loops past their deadline, sorted."""
        at = self._now(now)
        return sorted(s.name for s in self._loops.values() if at - s.last_beat > s.deadline)

    def healthy(self, now: float | None = None) -> bool:
        return not self.stalled(now)

    def report(self, now: float | None = None) -> dict[str, dict[str, object]]:
        """JSON-ready per-loop view for /v1/health."""
        at = self._now(now)
        return {
            s.name: {
                "deadline_seconds": s.deadline,
                "seconds_since_beat": round(max(at - s.last_beat, 0.0), 3),
                "healthy": at - s.last_beat <= s.deadline,
            }
            for s in sorted(self._loops.values(), key=lambda s: s.name)
        }

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
    idle_interval: float = 5.0,
) -> None:
    """Run until cancelled. `interval`: seconds between pings (watchdog_interval()); None
    sends no pings but still reports stalls in STATUS= every `idle_interval` seconds.
    STATUS= is sent only when its text changes (status_text() while healthy)."""
    period = interval if interval is not None else idle_interval
    if not period > 0:
        raise ValueError(f"watchdog interval must be > 0 seconds, got {period!r}")
    last_status: str | None = None
    while True:
        healthy_status = status_text() if status_text is not None else "running"
        tick = watchdog_tick(supervisor, supervisor.clock(), interval is not None, healthy_status)
        if tick.ping:
            notifier.watchdog()
        if tick.status != last_status:
            notifier.status(tick.status)
            last_status = tick.status
        await asyncio.sleep(period)
