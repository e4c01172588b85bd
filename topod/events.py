"""The event bus: every state change is published once, to the log and to /v1/events."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

Listener = Callable[[dict[str, Any]], None]


class EventBus:
    """Fan-out to subscribers (one bounded queue each); a slow subscriber loses its own
    oldest events and is told so, it never blocks the daemon."""

    def __init__(self, history: int = 256, queue_size: int = 1024) -> None:
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._listeners: list[Listener] = []
        self._history: deque[dict[str, Any]] = deque(maxlen=history)
        self._queue_size = queue_size
        self.counts: dict[str, int] = {}

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def publish(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "time": time.time(), **fields}
        self.counts[event] = self.counts.get(event, 0) + 1
        self._history.append(record)
        for listener in self._listeners:
            listener(record)
        for queue in list(self._subscribers):
            if queue.full():
                queue.get_nowait()
                queue.put_nowait({"event": "events_dropped", "time": record["time"], "count": 1})
            else:
                queue.put_nowait(record)
        return record

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(self._queue_size)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subscribers.discard(queue)

    def recent(self) -> list[dict[str, Any]]:
        return list(self._history)
