"""Supervised loops, as Erlang/OTP and systemd supervise: an iteration that raises is
logged once (per streak and per distinct error) as `loop_failed`, retried with
exponential backoff, and shown in /v1/health and STATUS=; the process never exits
because a loop failed. Progress is a beat to the watchdog's Supervisor, so only a loop
that stops iterating (hung in a read, a thread, a deadlock) stops WATCHDOG=1.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from topod.service.watchdog import Supervisor

log = structlog.get_logger("topod")

# One iteration: does its work (waiting for its trigger first if it has one) and returns
# the seconds to sleep before the next, or None to go again at once.
Iteration = Callable[[], Awaitable[float | None]]


@dataclass(frozen=True, slots=True)
class Backoff:
    first: float = 1.0
    cap: float = 60.0

    def delay(self, streak: int) -> float:
        return min(self.cap, self.first * 2 ** max(0, streak - 1))


async def supervise(supervisor: Supervisor, name: str, iteration: Iteration, *, deadline: float,
                    report: Callable[[str, str, str], None] | None = None,
                    backoff: Backoff = Backoff(), beat_on_failure: bool = True) -> None:
    """Run `iteration` until cancelled. `deadline`: seconds without a beat after which the
    watchdog calls the loop stalled. `report(name, error, where)` hears each failure worth
    a line (and then logs it); without it, supervise logs `loop_failed` itself. `beat_on_failure=False` for liveness checks, where failing is not progress."""
    token = supervisor.register(name, deadline)
    try:
        while True:
            try:
                delay = await iteration()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the point of a supervisor
                error = f"{type(exc).__name__}: {exc}"[:500]
                if supervisor.fail(name, error):
                    where = "".join(traceback.format_tb(exc.__traceback__)[-3:]).strip()
                    if report is not None:
                        report(name, error, where)
                    else:
                        log.error("loop_failed", loop=name, error=error, where=where)
                if beat_on_failure:
                    supervisor.beat(name)
                await asyncio.sleep(backoff.delay(supervisor.streak(name)))
                continue
            if supervisor.succeed(name):
                log.info("loop_recovered", loop=name)
            supervisor.beat(name)
            if delay:
                await asyncio.sleep(delay)
    finally:
        supervisor.unregister(name, token)

