"""A closed connection's transport, freed when it is dropped rather than by the collector.

asyncio's socket transport (CPython 3.11-3.13) keeps a bound method of itself
(`_read_ready_cb`): a reference cycle, so every closed connection's transport, its
socket object and its extra-info dict wait for the cyclic collector. With one connection
per request (topoctl, curl, the bench's clients), that garbage set off a young-generation
collection every ~30 lease round trips under saturation, each walking every live object of
the requests in flight. Once the connection is lost nothing reads from the
transport again (its reader left the selector before connection_lost was scheduled), so
the callback can go."""

from __future__ import annotations

import asyncio


def forget_read_callback(transport: asyncio.BaseTransport | None) -> None:
    """Break the transport's self-reference, if it has exactly the one described above;
    any other transport (another Python, another loop) is left as it is."""
    if transport is None:
        return
    callback = getattr(transport, "__dict__", {}).get("_read_ready_cb")
    if callback is not None and getattr(callback, "__self__", None) is transport:
        del transport.__dict__["_read_ready_cb"]
