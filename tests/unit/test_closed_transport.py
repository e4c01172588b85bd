"""A closed connection's asyncio transport is freed by reference counting alone once
topod.api.closed_transport has broken its self-reference (issue 26: those cycles set
off a young-generation collection every ~30 round trips under saturation)."""

from __future__ import annotations

import asyncio
import gc
import socket
from types import SimpleNamespace

import pytest

from topod.api.closed_transport import forget_read_callback


class Protocol(asyncio.Protocol):
    def __init__(self, forget: bool, lost: asyncio.Future) -> None:
        self.forget, self.lost, self.transport = forget, lost, None

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        if self.forget:
            forget_read_callback(self.transport)
        self.transport = None
        self.lost.set_result(None)


def _garbage_transports_after_a_connection(forget: bool) -> tuple[int, bool]:
    """(socket transports left as cyclic garbage, whether the transport had the callback)."""
    async def scenario() -> bool:
        ours, theirs = socket.socketpair()
        lost = asyncio.get_running_loop().create_future()
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: Protocol(forget, lost), ours)
        had_callback = "_read_ready_cb" in vars(transport)
        del transport
        theirs.close()  # the peer hangs up: EOF, the transport closes
        await lost
        await asyncio.sleep(0)  # _call_connection_lost's last steps
        return had_callback

    loop = asyncio.new_event_loop()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        had_callback = loop.run_until_complete(scenario())
        gc.collect()
        left = sum(1 for item in gc.garbage if type(item).__name__ == "_SelectorSocketTransport")
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        loop.close()
    return left, had_callback


def test_a_closed_transport_leaves_no_cyclic_garbage():
    left, had_callback = _garbage_transports_after_a_connection(forget=True)
    assert had_callback, "this Python's transport has the self-reference the module removes"
    assert left == 0


def test_without_it_the_transport_waits_for_the_collector():
    left, had_callback = _garbage_transports_after_a_connection(forget=False)
    if not had_callback:
        pytest.skip("this Python's transport keeps no bound method of itself")
    assert left == 1


@pytest.mark.parametrize("transport", [None, object(), asyncio.Transport(), SimpleNamespace(_read_ready_cb=print)])
def test_other_transports_are_left_as_they_are(transport):
    before = dict(getattr(transport, "__dict__", {}))
    forget_read_callback(transport)
    assert dict(getattr(transport, "__dict__", {})) == before
