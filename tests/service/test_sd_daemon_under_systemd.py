"""The real daemon started the way systemd starts topod.service: the API socket passed
at fd 3 (LISTEN_FDS), NOTIFY_SOCKET and WATCHDOG_USEC set. A datagram socket stands in
for systemd and sees READY=1, WATCHDOG=1 pings, RELOADING=1 on SIGHUP, STOPPING=1."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from topod.client import Client

REPO = Path(__file__).resolve().parents[2]
WATCHDOG_USEC = 400_000  # pings every 0.2 s

# systemd between fork and exec: the listening socket at fd 3, LISTEN_PID = our pid.
SPAWN = r"""
import os, sys
os.dup2(int(sys.argv[1]), 3, inheritable=True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="api",
                  WATCHDOG_PID=str(os.getpid()))
os.execv(sys.executable, [sys.executable, "-m", "topod.service.main", *sys.argv[2:]])
"""


class FakeSystemd:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages: list[dict[str, str]] = []

    def wait_for(self, key: str, timeout: float = 15.0) -> dict[str, str]:
        """The next message carrying `key`, collecting everything before it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                data = self.sock.recv(65536).decode()
            except TimeoutError:
                break
            message = dict(line.split("=", 1) for line in data.split("\n"))
            self.messages.append(message)
            if key in message:
                return message
        raise AssertionError(f"no {key}= within {timeout}s; got {self.messages[-5:]}")


@pytest.fixture()
def started(host_tree, tmp_path):
    short = Path(tempfile.mkdtemp(prefix="sdd", dir="/tmp"))
    systemd = FakeSystemd(str(short / "notify"))
    api_path = short / "topod.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(api_path))
    listener.listen(16)
    config = tmp_path / "topod.toml"
    config.write_text('[irq]\nmode = "dry-run"\n[probe]\nenabled = false\n')
    env = dict(os.environ, PYTHONPATH=str(REPO), NOTIFY_SOCKET=str(short / "notify"),
               WATCHDOG_USEC=str(WATCHDOG_USEC))
    log = open(tmp_path / "daemon.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-c", SPAWN, str(listener.fileno()), "--root", str(host_tree("vm-nogpu")),
         "--state-dir", str(tmp_path / "state"), "--config", str(config), "--log-format", "json"],
        pass_fds=(listener.fileno(),), env=env, stdout=log, stderr=log)
    listener.close()  # the daemon holds it now, as systemd would keep its own copy
    try:
        yield process, systemd, Client(str(api_path), timeout=10), tmp_path / "daemon.log"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        log.close()
        systemd.sock.close()
        shutil.rmtree(short, ignore_errors=True)


def test_daemon_speaks_sd_notify_and_serves_the_passed_socket(started):
    process, systemd, client, log = started
    try:
        ready = systemd.wait_for("READY")
    except AssertionError:
        pytest.fail(f"daemon never became ready: {log.read_text()[-2000:]}")
    assert client.health()["status"] == "ok"  # served on the socket handed over at fd 3
    systemd.wait_for("WATCHDOG")
    first = time.monotonic()
    systemd.wait_for("WATCHDOG")
    assert time.monotonic() - first < WATCHDOG_USEC / 1e6, "pings at half of WATCHDOG_USEC"
    assert "STATUS" in ready or any("STATUS" in m for m in systemd.messages)

    process.send_signal(signal.SIGHUP)
    reloading = systemd.wait_for("RELOADING")
    assert abs(int(reloading["MONOTONIC_USEC"]) - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000) < 10_000_000
    systemd.wait_for("READY")

    process.send_signal(signal.SIGTERM)
    systemd.wait_for("STOPPING")
    assert process.wait(timeout=15) == 0
