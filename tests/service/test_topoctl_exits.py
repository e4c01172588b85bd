"""topoctl's exit status means what it says: 75 only when a retry can succeed (no free
capacity now, the daemon restarting); a request the host can never satisfy is 1 with the
reason; permission denied on the socket names the group to join and is 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_PROBES = '[irq]\nmode = "off"\n[probe]\nenabled = false\n'


def topoctl(socket: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "--socket", socket, *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_requests_the_host_can_never_satisfy_exit_1_and_a_busy_host_75(daemon_factory):
    daemon = daemon_factory(config=NO_PROBES)
    daemon.start()
    too_many = topoctl(daemon.socket, "allocate", "--gpus", "9")
    assert too_many.returncode == 1 and "this host has 8" in too_many.stderr, too_many
    no_model = topoctl(daemon.socket, "allocate", "--gpus", "1", "--model", "Z9000")
    assert no_model.returncode == 1 and "0 matching" in no_model.stderr, no_model
    assert "its models: NVIDIA H800" in no_model.stderr  # what it could have asked for
    assert topoctl(daemon.socket, "allocate", "--gpus", "8", "--level", "any").returncode == 0
    busy = topoctl(daemon.socket, "allocate", "--gpus", "1")
    assert busy.returncode == 75 and "free" in busy.stderr, busy


def test_a_gpu_less_host_exits_1(daemon_factory):
    daemon = daemon_factory("vm-nogpu", config=NO_PROBES)
    daemon.start()
    answer = topoctl(daemon.socket, "allocate", "--gpus", "1")
    assert answer.returncode == 1 and "no GPUs" in answer.stderr, answer


def test_no_daemon_is_75(tmp_path):
    answer = topoctl(str(tmp_path / "absent.sock"), "status")
    assert answer.returncode == 75 and "cannot reach topod" in answer.stderr, answer


def test_permission_denied_on_the_socket_names_the_group_and_exits_1(daemon_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root to ask as another user")
    daemon = daemon_factory(config=NO_PROBES)
    daemon.start()
    for parent in Path(daemon.socket).parents:  # nobody may reach the socket file, not open it
        if str(parent).startswith("/tmp/"):
            os.chmod(parent, os.stat(parent).st_mode | 0o011)
    os.chmod(daemon.socket, 0o660)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        code = 99
        try:
            sys.stderr = open(write, "w", closefd=False)  # noqa: SIM115 - flushed before _exit
            os.setgid(65534)
            os.setgroups([])
            os.setuid(65534)
            from topod.cli.topoctl import main

            code = main(["--socket", daemon.socket, "allocate", "--gpus", "1"])
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write)
    err = b""
    while chunk := os.read(read, 65536):
        err += chunk
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 1, err
    assert b"permission denied" in err and b"join group topod" in err, err
