"""A closed connection's asyncio transport is freed by reference counting alone once
topod.api.closed_transport has broken its self-reference (issue 26: those cycles set
off a young-generation collection every ~30 round trips under saturation)."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest
from cyclic_garbage import garbage_after

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
    try:
        had_callback, left = garbage_after(lambda: loop.run_until_complete(scenario()))
    finally:
        loop.close()
    return left["_SelectorSocketTransport"], had_callback


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


def test_a_connection_aiohttp_served_leaves_no_transport_garbage(tmp_path):
    """The same for every connection the API hands to aiohttp (GatedRequestHandler)."""
    from aiohttp import web

    from topod.service.connection_gate import ConnectionGate
    from topod.service.server import GatedSockSite

    async def ping(request):
        return web.json_response({"ok": True})

    def fetch() -> bytes:  # a plain blocking client: no asyncio transport of its own
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(tmp_path / "api.sock"))
            client.sendall(b"GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := client.recv(65536):
                data += chunk
        return data

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/ping", ping)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        listen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listen.bind(str(tmp_path / "api.sock"))
        site = GatedSockSite(runner, listen, ConnectionGate(16), {"access_log": None})
        await site.start()
        try:
            for _ in range(3):
                assert (await asyncio.to_thread(fetch)).startswith(b"HTTP/1.1 200")
            await asyncio.sleep(0.05)  # the server's side of each close
        finally:
            await runner.cleanup()

    _, left = garbage_after(lambda: asyncio.run(scenario()))
    assert left["_SelectorSocketTransport"] == 0
