"""topod leaves no trace of a start that failed (the state directory it created is gone)
and none of a clean stop (its socket file is removed, only while it is still its own)."""

from __future__ import annotations

import os
import signal
import socket

import pytest


def test_a_failed_start_removes_the_state_directory_it_created(daemon_factory):
    daemon = daemon_factory()
    os.makedirs(os.path.dirname(daemon.socket), exist_ok=True)
    with open(daemon.socket, "w") as blocker:  # not a socket: the bind refuses to replace it
        blocker.write("mine\n")
    daemon.state = os.path.join(daemon.workdir, "new", "state")
    with pytest.raises(RuntimeError, match="daemon exited 1"):
        daemon.start()
    assert "is not a socket" in daemon.log()
    assert not os.path.exists(os.path.join(daemon.workdir, "new")), os.listdir(daemon.workdir)
    assert open(daemon.socket).read() == "mine\n"


def test_a_failed_start_keeps_a_state_directory_that_was_there(daemon_factory):
    daemon = daemon_factory()
    os.makedirs(daemon.state)
    with open(os.path.join(daemon.state, "notes"), "w") as notes:
        notes.write("kept\n")
    with open(daemon.socket, "w") as blocker:
        blocker.write("x")
    with pytest.raises(RuntimeError):
        daemon.start()
    assert "notes" in os.listdir(daemon.state)


def test_sigterm_removes_the_socket_file(daemon_factory):
    daemon = daemon_factory()
    daemon.start()
    assert os.path.exists(daemon.socket)
    assert daemon.stop(signal.SIGTERM) == 0
    assert not os.path.exists(daemon.socket)


def test_a_socket_file_that_is_no_longer_ours_is_left_alone(daemon_factory):
    daemon = daemon_factory()
    daemon.start()
    os.unlink(daemon.socket)  # someone put another socket in its place
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(daemon.socket)
    try:
        assert daemon.stop(signal.SIGTERM) == 0
        assert os.path.exists(daemon.socket)
    finally:
        other.close()
