"""A client's half-close told from its hang-up, on the API's Unix socket.

A client may send its whole request, then shutdown(SHUT_WR) and wait for the answer (a
shell's `nc -U -N`, scripts that mark the end of what they send). Reading shows both as
the same EOF; the socket tells them apart: once the peer has closed (or shut down both
ways) a Unix stream socket reports POLLHUP, and a half-closed one does not. A half-closed
client with a whole request in hand is answered, then its connection closes (as nginx and
HTTP/1.1 servers do); only a peer that is gone, or one that stops before its request is
complete, is a hang-up: its waiting request is withdrawn, a grant made for it ends.

On TCP a peer's close is only a FIN, like a half-close; the API listens on Unix sockets,
and anywhere else a gone peer is still found when the answer's write fails.
"""

from __future__ import annotations

import asyncio
import select
from typing import Any

_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


def peer_gone(transport: asyncio.BaseTransport | None) -> bool:
    """True when the connection's peer has closed (or shut down both ways), or the
    socket can no longer be asked: one poll(2) that never waits."""
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False  # not a socket (a test's transport): only a failed write can tell
    try:
        fd = sock.fileno()
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, _GONE)  # HUP and ERR are always reported; asked for all the same
        return any(events & _GONE for _, events in poller.poll(0))
    except (OSError, ValueError):
        return True


def aiohttp_request_in_hand(handler: Any, last_payload: Any) -> bool:
    """Whether aiohttp's connection protocol (its RequestHandler) holds a request received
    whole and not yet answered: it is not idle waiting for one, and the body of the last
    request it parsed has all arrived (`last_payload`, its StreamReader; a GET's is empty
    and complete). A head without all of its body is a request the client abandoned."""
    waiter = getattr(handler, "_waiter", None)
    idle = waiter is not None and not waiter.done() and not getattr(handler, "_messages", None)
    if idle or last_payload is None:
        return False
    try:
        return bool(last_payload.is_eof())
    except AttributeError:
        return False
