"""The event bus: every state change is published once, to the log and to /v1/events."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("topod")

Listener = Callable[[dict[str, Any]], None]


class EventBus:
    """Fan-out to subscribers (one bounded queue each); a slow subscriber loses its own
    oldest events and is told so, it never blocks the daemon.

    Listeners (the log, the daemon's reactions) run once the callback that published is
    over, on a running loop: an answer written in that callback goes out before its log
    line is rendered (structlog's JSON costs the loop ~40 us an event, and it sat between
    a grant's commit and its answer). In publish order; a listener that fails is logged
    and the others still run. Without a running loop they run at once; drain() runs what
    is still due (at shutdown)."""

    def __init__(self, history: int = 256, queue_size: int = 1024) -> None:
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._listeners: list[Listener] = []
        self._history: deque[dict[str, Any]] = deque(maxlen=history)
        self._queue_size = queue_size
        self.counts: dict[str, int] = {}
        self._due: list[dict[str, Any]] = []  # records whose listeners have not run yet
        # The loop a drain is due on (per loop: one closed before its drain ran must not
        # keep the next from scheduling one).
        self._drain_due: asyncio.AbstractEventLoop | None = None

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def publish(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "time": time.time(), **fields}
        self.counts[event] = self.counts.get(event, 0) + 1
        self._history.append(record)
        if self._listeners:
            self._notify_later(record)
        for queue in list(self._subscribers):
            if queue.full():
                queue.get_nowait()
                queue.put_nowait({"event": "events_dropped", "time": record["time"], "count": 1})
            else:
                queue.put_nowait(record)
        return record

    def _notify_later(self, record: dict[str, Any]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._due.append(record)
        if loop is None:
            self.drain()
        elif self._drain_due is not loop:  # one callback for a burst of events
            self._drain_due = loop
            loop.call_soon(self.drain)

    def drain(self) -> None:
        """Run the listeners of every record published and not yet told."""
        self._drain_due = None
        while self._due:
            due, self._due = self._due, []
            for record in due:
                for listener in self._listeners:
                    try:
                        listener(record)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException:  # noqa: BLE001 - one listener's fault is not the publisher's
                        _report_failed(listener, record)

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(self._queue_size)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(queue)

    def recent(self) -> list[dict[str, Any]]:
        return list(self._history)


def _report_failed(listener: Listener, record: dict[str, Any]) -> None:
    """Log a listener's failure; if the log itself is what fails (the log is a listener
    too), say it on stderr and go on: the other records are still told."""
    try:
        log.exception("event_listener_failed", published=record.get("event"),
                      listener=getattr(listener, "__qualname__", repr(listener)))
    except Exception as exc:  # noqa: BLE001 - the last resort of the last resort
        try:
            sys.stderr.write(f"topod: event listener failed on {record.get('event')!r}, and so did its log line: "
                             f"{type(exc).__name__}: {exc}\n")
        except (OSError, ValueError):
            pass
