"""sd_notify over a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import uuid

import pytest

from topod.service.notify import Notifier, monotonic_usec, notify_address


@pytest.fixture()
def systemd_socket():
    """A bound datagram socket at a short path (AF_UNIX paths are limited to 108 bytes)."""
    directory = tempfile.mkdtemp(prefix="sdn", dir="/tmp")
    path = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2.0)
    yield path, sock
    sock.close()
    shutil.rmtree(directory, ignore_errors=True)


def _receive(sock: socket.socket) -> dict[str, str]:
    lines = sock.recv(65536).decode("utf-8").split("\n")
    return dict(line.split("=", 1) for line in lines)


def test_ready_status_watchdog_and_stopping_reach_the_socket(systemd_socket):
    path, sock = systemd_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready()
    assert _receive(sock) == {"READY": "1"}
    assert notifier.status("2 lease(s); 6/8 GPU(s) free")
    assert _receive(sock) == {"STATUS": "2 lease(s); 6/8 GPU(s) free"}
    assert notifier.watchdog()
    assert _receive(sock) == {"WATCHDOG": "1"}
    assert notifier.stopping()
    assert _receive(sock) == {"STOPPING": "1"}
    assert notifier.sent == 4


def test_ready_with_status_is_one_datagram(systemd_socket):
    path, sock = systemd_socket
    Notifier({"NOTIFY_SOCKET": path}).ready(status="serving")
    assert _receive(sock) == {"READY": "1", "STATUS": "serving"}


def test_reloading_carries_monotonic_usec_of_now(systemd_socket):
    path, sock = systemd_socket
    before = monotonic_usec()
    Notifier({"NOTIFY_SOCKET": path}).reloading()
    after = monotonic_usec()
    message = _receive(sock)
    assert message["RELOADING"] == "1"
    assert before <= int(message["MONOTONIC_USEC"]) <= after


def test_monotonic_usec_is_clock_monotonic_in_microseconds():
    assert abs(monotonic_usec() - time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6) < 1e5


def test_abstract_notify_socket_is_reached():
    name = f"topod-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert _receive(sock) == {"READY": "1"}
    finally:
        sock.close()


def test_status_text_is_utf8_and_folded_to_one_line(systemd_socket):
    path, sock = systemd_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    notifier.status("config rejected:\n  [irq] mode → 'fast' is not one of continuous, dry-run, off")
    assert _receive(sock) == {"STATUS": "config rejected: [irq] mode → 'fast' is not one of continuous, dry-run, off"}


def test_without_notify_socket_every_call_is_a_quiet_no_op():
    notifier = Notifier({})
    assert not notifier.enabled
    assert "NOTIFY_SOCKET is not set" in notifier.disabled_reason
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert notifier.reloading() is False
    assert notifier.sent == 0


@pytest.mark.parametrize("value", ["relative/path", "vsock:2:1234", "@", ""])
def test_unusable_notify_addresses_disable_notification(value):
    assert notify_address(value) is None
    notifier = Notifier({"NOTIFY_SOCKET": value})
    assert not notifier.enabled
    assert notifier.status("x") is False


def test_notify_address_forms():
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert notify_address("@abstract") == b"\0abstract"


def test_gone_systemd_returns_false_with_the_errno_instead_of_raising(systemd_socket):
    path, sock = systemd_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.ready()
    sock.close()
    os.unlink(path)
    assert notifier.watchdog() is False
    assert notifier.last_error.startswith(("ENOENT", "ECONNREFUSED"))
    # It recovers as soon as systemd is back at the same path.
    again = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    again.bind(path)
    again.settimeout(2.0)
    try:
        assert notifier.watchdog() is True
        assert notifier.last_error is None
        assert _receive(again) == {"WATCHDOG": "1"}
    finally:
        again.close()


def test_a_full_systemd_queue_never_blocks_the_caller(systemd_socket):
    path, _sock = systemd_socket  # nobody reads: the queue fills up
    notifier = Notifier({"NOTIFY_SOCKET": path})
    started = time.monotonic()
    results = [notifier.status("x" * 1000) for _ in range(5000)]
    assert False in results, "a never-read datagram queue must fill up"
    assert notifier.last_error.startswith("EAGAIN")
    assert time.monotonic() - started < 5.0


def test_a_malformed_assignment_is_a_programming_error():
    notifier = Notifier({"NOTIFY_SOCKET": "/nonexistent/notify"})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        notifier.send("READY")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        notifier.send("STATUS=a\nREADY=1")


def test_unset_environment_hides_the_socket_from_children(monkeypatch, systemd_socket):
    path, sock = systemd_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    notifier = Notifier(unset_environment=True)
    assert "NOTIFY_SOCKET" not in os.environ
    assert notifier.ready()
    assert _receive(sock) == {"READY": "1"}
