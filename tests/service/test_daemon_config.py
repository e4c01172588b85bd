"""One configuration schema: `topod --check-config`, a start and a reload refuse the same
files at load time, with one line naming the key; a refused reload changes nothing and
`topoctl reload` (the unit's ExecReload=) says so with its exit status; keys read only at
start are reported on reload and keep their value; a config error at start exits 78."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topod.config import parse_config
from topod.service.main import EX_CONFIG, main as topod_main

REPO = Path(__file__).resolve().parents[2]
GOOD = '[irq]\nmode = "dry-run"\ninterval_seconds = 0.5\n[probe]\nenabled = false\n'

# (file text, the key the one error line must name, a word of the allowed values)
BAD = [
    ('[irq.policy]\nrdma = "spred"\n', "irq.policy.rdma", "pin-node"),
    ('[irq.policy]\nstorage = "spread"\n', "irq.policy.storage", "nvme"),
    ('[irq.irq_overrides]\n"42" = "elsewhere"\n', "irq.irq_overrides.42", "CPU list"),
    ('[irq.device_overrides]\nmlx5_0 = "7-x"\n', "irq.device_overrides.mlx5_0", "spread"),
    ('[probe]\nbackend = "gpudirect"\n', "probe.backend", "host-memory"),
    ('[probe]\nbackend = "simulated"\n', "probe.simulated_table", "table"),
    ('[probe]\nbudget_share = 1.5\n', "probe.budget_share", "(0, 1]"),
    ('[api]\nmax_connections = 0\n', "api.max_connections", "minimum, 1"),
    ('[daemon]\ngroup = "no-such-group-topod-test"\n', "daemon.group", "no group"),
]


def _topoctl(socket: str, *args: str, **options) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "--socket", socket, *args],
                          capture_output=True, text=True, timeout=60, env=env, **options)


def _wait_until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize(("text", "key", "allowed"), BAD, ids=[b[1] for b in BAD])
def test_check_config_refuses_what_a_loop_would_fail_on_with_one_line_naming_the_key(tmp_path, capsys, text, key,
                                                                                      allowed):
    path = tmp_path / "topod.toml"
    path.write_text(text)
    assert topod_main(["--check-config", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and allowed in err, err


def test_check_config_accepts_the_documented_file_and_valid_overrides(tmp_path, capsys):
    assert topod_main(["--check-config", str(REPO / "etc/topod.toml")]) == 0
    path = tmp_path / "ok.toml"
    path.write_text('[irq.policy]\nrdma = "pin-node"\n[irq.irq_overrides]\n"42" = "4-7"\n'
                    '[irq.device_overrides]\nmlx5_0 = "leave"\n[daemon]\ngroup = "root"\n')
    assert topod_main(["--check-config", str(path)]) == 0


def test_a_bad_config_at_start_exits_78_with_one_line(daemon_factory):
    daemon = daemon_factory(config='[irq.policy]\nrdma = "spred"\n')
    with pytest.raises(RuntimeError, match="daemon exited 78"):
        daemon.start()
    lines = [line for line in daemon.log().splitlines() if line.strip()]
    assert len(lines) == 1 and "irq.policy.rdma" in lines[0] and "spread" in lines[0], lines
    assert daemon.process.returncode == EX_CONFIG == 78


@pytest.mark.parametrize(("text", "key", "allowed"), BAD[:1] + BAD[4:5] + BAD[7:9], ids=["policy", "backend",
                                                                                        "max_connections", "group"])
def test_topoctl_reload_refuses_a_bad_file_and_the_daemon_keeps_running_it_all(daemon_factory, text, key, allowed):
    daemon = daemon_factory(config=GOOD)
    client = daemon.start()
    assert _wait_until(lambda: client.health()["irq"].get("cycles", 0) >= 1)
    daemon.config_path.write_text(text)
    refused = _topoctl(daemon.socket, "reload")
    assert refused.returncode == 1, refused
    assert key in refused.stderr and "running config is kept" in refused.stderr, refused.stderr
    health = client.health()
    assert health["config_error"] and key in health["config_error"]
    status = _topoctl(daemon.socket, "status")
    assert status.returncode == 1 and f"degraded: config rejected: {key}" in status.stdout, status
    assert not health["loops"]["irq"]["failing"] and health["irq"]["mode"] == "dry-run"
    cycles = health["irq"]["cycles"]
    assert _wait_until(lambda: client.health()["irq"]["cycles"] > cycles), "IRQ balancing goes on"
    daemon.process.send_signal(signal.SIGHUP)  # SIGHUP gets the same verdict, in the log
    assert _wait_until(lambda: daemon.log().count("config_rejected") >= 2)
    assert "loop_failed" not in daemon.log()
    daemon.config_path.write_text(GOOD)
    applied = _topoctl(daemon.socket, "reload")
    assert applied.returncode == 0 and "applied" in applied.stdout, applied
    assert _wait_until(lambda: client.health()["status"] == "ok"), client.health()


def test_a_reload_names_keys_read_only_at_start_and_keeps_them(daemon_factory):
    daemon = daemon_factory(config=GOOD)
    client = daemon.start()
    mode = stat.S_IMODE(os.stat(daemon.socket).st_mode)
    daemon.config_path.write_text(GOOD + '[daemon]\nsocket_mode = "0600"\nsocket = "/elsewhere.sock"\n'
                                         '[alloc]\ndefault_level = "any"\n')
    answer = _topoctl(daemon.socket, "--json", "reload")
    assert answer.returncode == 0, answer
    assert "daemon.socket_mode" in answer.stdout and "/elsewhere" not in answer.stdout
    assert '"daemon.socket"' not in answer.stdout, "--socket on the command line wins over the file"
    line = next(l for l in daemon.log().splitlines() if "config_restart_required" in l)
    assert "daemon.socket_mode" in line
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == mode
    assert client.health()["status"] == "ok"


def test_reload_over_the_api_is_root_only(daemon_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root to ask as another user")
    daemon = daemon_factory(config=GOOD + '[daemon]\nsocket_mode = "0666"\n')
    daemon.start()
    for parent in Path(daemon.socket).parents:  # let nobody reach the socket through the test's tmp dirs
        if str(parent).startswith("/tmp/"):
            os.chmod(parent, os.stat(parent).st_mode | 0o011)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # as nobody: the daemon's peer check sees uid 65534
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(daemon.socket)
            sock.sendall(b"POST /v1/reload HTTP/1.1\r\nHost: topod\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            os.write(write, answer)
        finally:
            os._exit(0)
    os.close(write)
    answer = b""
    while chunk := os.read(read, 65536):
        answer += chunk
    os.waitpid(child, 0)
    assert answer.startswith(b"HTTP/1.1 403") and b"root-only" in answer, answer
    assert "config_reloaded" not in daemon.log()


def test_restart_keys_changed_in_the_file_are_reported_unless_given_on_the_command_line():
    running = parse_config('[daemon]\nroot = "/"\n').with_overrides(socket="/run/x.sock")
    new = parse_config('[daemon]\nroot = "/mnt/other"\nsocket = "/run/y.sock"\nstate_dir = "/srv/topod"\n'
                       '[log]\nlevel = "debug"\n')
    assert running.restart_changes(new) == ["daemon.root", "daemon.state_dir", "log.level"]
    kept = new.keeping(running)
    assert kept.get("daemon", "root") == "/" and kept.get("daemon", "socket") == "/run/x.sock"
    assert kept.get("log", "level") == "info"


def test_a_second_daemon_on_the_same_state_dir_exits_75_naming_the_holder(daemon_factory):
    """Temporary (the holder may be stopping): EX_TEMPFAIL, which the unit restarts, not
    the configuration error's 78, which it never retries."""
    first = daemon_factory(config=None)
    client = first.start()
    lease = client.allocate(2)
    second = daemon_factory(config=None, root=first.root)
    second.state = first.state
    with pytest.raises(RuntimeError, match="daemon exited 75"):
        second.start()
    lines = [line for line in second.log().splitlines() if line.strip()]
    assert len(lines) == 1 and f"pid {first.process.pid}" in lines[0] and first.state in lines[0], lines
    assert client.lease(lease["id"])["state"] == "active" and client.health()["status"] == "ok"
    first.stop(signal.SIGKILL)  # the kernel drops the lock with the process: no stale file blocks a start
    third = daemon_factory(config=None, root=first.root)
    third.state = first.state
    assert [l["id"] for l in third.start().leases()] == [lease["id"]]


def test_a_link_in_place_of_the_lock_file_is_refused(daemon_factory, tmp_path):
    daemon = daemon_factory(config=None)
    os.makedirs(daemon.state)
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.symlink(target, Path(daemon.state) / "topod.lock")
    with pytest.raises(RuntimeError, match="daemon exited 78"):
        daemon.start()
    assert "topod.lock" in daemon.log() and "a link" in daemon.log()
