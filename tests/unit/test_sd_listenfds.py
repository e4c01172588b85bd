"""sd_listen_fds: sockets passed the way systemd passes them (fd 3 onwards, LISTEN_*)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from topod.service.listenfds import listen_fds, select_socket

REPO = Path(__file__).resolve().parents[2]

# What systemd does between fork and exec: the socket at fd 3, LISTEN_PID = the pid
# that exec keeps, then exec the service. The service here takes the socket through
# listen_fds(), reports what it saw and serves one connection.
SPAWN = r"""
import os, sys
os.dup2(int(sys.argv[1]), 3, inheritable=True)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="api")
os.execv(sys.executable, [sys.executable, "-c", sys.argv[2]])
"""
SERVICE = r"""
import fcntl, json, os, sys
from topod.service.listenfds import listen_fds, select_socket
fds = listen_fds()
sock = select_socket(fds)
print(json.dumps({"names": sorted(fds), "fd": sock.fileno(),
                  "cloexec": bool(fcntl.fcntl(sock.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC),
                  "env_left": [k for k in os.environ if k.startswith("LISTEN_")]}), flush=True)
conn, _ = sock.accept()
conn.sendall(b"hello from " + str(os.getpid()).encode())
conn.close()
"""


@pytest.fixture()
def short_dir():
    directory = tempfile.mkdtemp(prefix="sdl", dir="/tmp")
    yield Path(directory)
    shutil.rmtree(directory, ignore_errors=True)


def _listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock


def test_a_socket_passed_at_fd_3_accepts_connections_in_the_service(short_dir):
    path = short_dir / "topod.sock"
    listener = _listening(path)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", SPAWN, str(listener.fileno()), SERVICE],
                             pass_fds=(listener.fileno(),), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        report = json.loads(child.stdout.readline() or b"null")
        assert report == {"names": ["api"], "fd": 3, "cloexec": True, "env_left": []}, child.stderr.read()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(5)
        client.connect(str(path))
        assert client.recv(100) == f"hello from {child.pid}".encode()
        client.close()
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
        child.wait()
        listener.close()


def _place(socks: list[socket.socket], base: int) -> int:
    """Duplicate sockets onto consecutive free descriptors from `base` (pytest owns 3...)."""
    while any(_is_open(base + i) for i in range(len(socks))):
        base += 16
    for i, sock in enumerate(socks):
        os.dup2(sock.fileno(), base + i, inheritable=True)
    return base


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_names_come_from_listen_fdnames_and_fds_become_cloexec(short_dir):
    a, b = _listening(short_dir / "a"), _listening(short_dir / "b")
    base = _place([a, b], 200)
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "api:metrics"}
    got = listen_fds(env, first_fd=base)
    try:
        assert sorted(got) == ["api", "metrics"]
        assert got["api"].fileno() == base and got["metrics"].getsockname() == str(short_dir / "b")
        assert all(fcntl.fcntl(s.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC for s in got.values())
        assert env == {}, "the LISTEN_* variables are removed so children never see them"
        assert select_socket(got) is got["api"]
    finally:
        for sock in (*got.values(), a, b):
            sock.close()


def test_unnamed_and_repeated_names_stay_distinct(short_dir):
    socks = [_listening(short_dir / n) for n in "abc"]
    base = _place(socks, 300)
    got = listen_fds({"LISTEN_PID": "77", "LISTEN_FDS": "3", "LISTEN_FDNAMES": "api:api:"}, pid=77, first_fd=base)
    assert sorted(got) == ["api", "api:2", "unknown"]
    for sock in (*got.values(), *socks):
        sock.close()


def test_descriptors_meant_for_another_process_are_left_alone():
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "api"}
    assert listen_fds(env) == {}
    assert env == {}


def test_unset_false_keeps_the_variables():
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
    listen_fds(env, unset=False)
    assert env == {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}


def test_nothing_passed_is_an_empty_dict():
    assert listen_fds({}) == {}
    assert listen_fds({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}) == {}
    assert select_socket({}) is None


@pytest.mark.parametrize(("env", "message"), [
    ({"LISTEN_PID": "abc", "LISTEN_FDS": "1"}, "LISTEN_PID='abc' is not a process id"),
    ({"LISTEN_PID": "{pid}", "LISTEN_FDS": "x"}, "LISTEN_FDS='x' is not a count"),
    ({"LISTEN_PID": "{pid}"}, "LISTEN_FDS=None is not a count"),
    ({"LISTEN_PID": "{pid}", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "api"},
     "LISTEN_FDNAMES='api' names 1 descriptor\\(s\\) but LISTEN_FDS=2"),
])
def test_malformed_variables_are_named(env, message):
    env = {k: v.replace("{pid}", str(os.getpid())) for k, v in env.items()}
    with pytest.raises(ValueError, match=message):
        listen_fds(env)


def test_a_descriptor_that_is_not_a_socket_is_refused():
    read_end, write_end = os.pipe()
    try:
        base = 400
        while _is_open(base):
            base += 16
        os.dup2(read_end, base)
        with pytest.raises(ValueError, match=f"descriptor {base} \\(api\\) from systemd is not a socket"):
            listen_fds({"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "api"}, pid=1, first_fd=base)
        os.close(base)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_select_socket_refuses_datagram_and_unlistened_sockets(short_dir):
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(ValueError, match="expected a ListenStream= Unix socket"):
            select_socket({"api": dgram})
        stream.bind(str(short_dir / "s"))
        with pytest.raises(ValueError, match="is not listening"):
            select_socket({"api": stream})
    finally:
        dgram.close()
        stream.close()


def test_select_socket_needs_the_name_when_several_are_passed(short_dir):
    a, b = _listening(short_dir / "a"), _listening(short_dir / "b")
    try:
        with pytest.raises(ValueError, match=r"\['x', 'y'\] and none is named 'api'"):
            select_socket({"x": a, "y": b})
        assert select_socket({"only": a}) is a
    finally:
        a.close()
        b.close()
