"""The lean API connections' idle timeout (topod.api.leanhttp): one timer for all of them.

Its own module because it is the site's, not one connection's: the socket site
(topod.service.server) owns the sweep and the set of connections it walks, and a
connection only says when it last went idle and closes itself when told.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topod.api.leanhttp import LeanConnection


class IdleSweep:
    """Closes the site's idle lean connections: one timer for all of them, a few times per
    [api] idle_timeout_seconds, instead of a timer armed and cancelled per request. A
    connection closes between `seconds` and `seconds` + one period after its last answer."""

    def __init__(self, connections: set[LeanConnection], seconds: float) -> None:
        self.connections = connections
        self.seconds = seconds
        self.period = min(1.0, max(0.05, seconds / 4))
        self._handle: asyncio.TimerHandle | None = None

    def watch(self) -> None:
        """A connection opened: sweep while there are any."""
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.period, self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        now = asyncio.get_running_loop().time()
        for connection in list(self.connections):
            connection.close_if_idle(now, self.seconds)
        if self.connections:
            self.watch()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
