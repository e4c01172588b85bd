"""topod.api.half_close.peer_gone tells a Unix socket peer's half-close from its close."""

from __future__ import annotations

import socket

import pytest

from topod.api.half_close import peer_gone


class _Transport:
    def __init__(self, sock: socket.socket, closing: bool = False) -> None:
        self.sock, self.closing = sock, closing

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str):
        return self.sock if name == "socket" else None


@pytest.fixture()
def pair():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_a_peer_that_only_half_closed_is_still_there(pair):
    ours, theirs = pair
    theirs.sendall(b"GET / HTTP/1.1\r\n\r\n")
    theirs.shutdown(socket.SHUT_WR)
    assert not peer_gone(_Transport(ours))
    ours.sendall(b"answer")  # and it can be answered
    assert theirs.recv(16) == b"answer"


@pytest.mark.parametrize("how", ["close", "shutdown both ways"])
def test_a_peer_that_closed_is_gone(pair, how):
    ours, theirs = pair
    theirs.shutdown(socket.SHUT_WR)
    if how == "close":
        theirs.close()
    else:
        theirs.shutdown(socket.SHUT_RDWR)
    assert peer_gone(_Transport(ours))


def test_an_open_peer_or_a_closing_transport(pair):
    ours, _ = pair
    assert not peer_gone(_Transport(ours))
    assert peer_gone(_Transport(ours, closing=True))
    assert peer_gone(None)
