"""The API's connection budget follows the real descriptor limit: root (and the daemon's
own uid) always keeps a connection of its own, one uid's share is cut to the ceiling the
limit leaves so that no single uid holds every user slot, and a limit too low for
[api] max_connections is logged at start and keeps health degraded."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import time

import pytest
from structlog.testing import capture_logs

from topod.service.connection_gate import ConnectionGate, DescriptorBudget, own_descriptors

MEMBER, OTHER_MEMBER = 65534, 65533
DEFAULTS = {"limit": 256, "per_uid": 64, "root_reserve": 16}  # etc/topod.toml's [api]
OWN = sum(own_descriptors(gpus=8, workers=6).values())  # an 8-GPU host on a 2-CPU machine


def _gate(nofile: int | None, own_uid: int = 0, **settings) -> ConnectionGate:
    values = {**DEFAULTS, **settings}
    return ConnectionGate(values["limit"], nofile=nofile, per_uid=values["per_uid"],
                          root_reserve=values["root_reserve"], own_descriptors=OWN, own_uid=own_uid)


def _fill(gate: ConnectionGate, uid: int, tries: int = 1000) -> int:
    return sum(1 for _ in range(tries) if gate.admit(uid))


# -- the gate, as plain values -----------------------------------------------------------
@pytest.mark.parametrize("nofile", [16, 64, 96, 128, 256, None])
def test_root_keeps_a_connection_whatever_the_descriptor_limit(nofile):
    gate = _gate(nofile)
    for uid in range(1000, 1010):  # every user takes what it can
        _fill(gate, uid)
    assert gate.admit(MEMBER) is False
    assert gate.admit(0) is True, f"root locked out at nofile {nofile}"


def test_the_daemons_own_uid_shares_roots_reserve():
    gate = _gate(64, own_uid=4242)
    assert gate.admit(MEMBER) is False and gate.last_refusal[1] == "root_reserve"
    assert gate.admit(4242) is True, "the daemon's own user (its checks, topoctl as topod) gets in"


def test_a_reserve_of_zero_still_leaves_root_one_connection():
    gate = _gate(None, limit=4, root_reserve=0, per_uid=None)
    assert _fill(gate, 1000) + _fill(gate, 1001) == 3
    assert gate.admit(0) is True


@pytest.mark.parametrize("nofile", [96, 128, 160, 256, 512])
def test_no_single_uid_takes_every_user_slot_when_the_limit_lowers_the_ceiling(nofile):
    gate = _gate(nofile)
    users = gate.ceiling - gate.reserve
    held = _fill(gate, MEMBER)
    assert 1 <= held < users, (held, users)
    assert held <= gate.share <= DEFAULTS["per_uid"]
    assert _fill(gate, OTHER_MEMBER) >= 1, "a second user still gets a connection"
    assert gate.admit(0) is True


def test_the_share_follows_the_ceiling_in_proportion_to_the_configured_share():
    assert _gate(None).share == 64, "an unlowered ceiling keeps [api] max_connections_per_uid"
    lowered = _gate(128)
    users, configured_users = lowered.ceiling - lowered.reserve, 256 - 16
    assert lowered.share == users * 64 // configured_users


@pytest.mark.parametrize("limit, per_uid, reserve", [(8, 64, 2), (4, 3, 1), (100, 100, 0), (6, 5, 2)])
def test_two_uids_can_hold_connections_even_when_the_share_is_configured_as_everything(limit, per_uid, reserve):
    gate = _gate(None, limit=limit, per_uid=per_uid, root_reserve=reserve)
    assert _fill(gate, MEMBER) >= 1 and _fill(gate, OTHER_MEMBER) >= 1


def test_a_limit_too_low_for_max_connections_is_logged_and_named():
    gate = _gate(64)
    problem = gate.shortfall()
    needed = DescriptorBudget(64, OWN).nofile_for(256)
    assert "descriptor limit 64" in problem and "none for users" in problem
    assert f"at least {needed}" in problem
    with capture_logs() as logs:
        gate.log_budget()
    warning, = [entry for entry in logs if entry["event"] == "max_connections_lowered"]
    assert warning["log_level"] == "warning" and warning["root_reserved"] == 1
    assert warning["needed_descriptor_limit"] == needed and warning["max_connections"] == 1
    assert _gate(needed).shortfall() is None and _gate(None).shortfall() is None
    with capture_logs() as logs:
        _gate(None).log_budget()
    assert logs == []


def test_refusals_linger_only_while_descriptors_allow():
    assert DescriptorBudget(None).linger == 16 and DescriptorBudget(4096, OWN).linger == 16
    assert DescriptorBudget(64, OWN).linger == 0, "at a tight limit a refused connection is closed at once"


# -- the daemon, over its real socket ------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
CONFIG = '[irq]\nmode = "off"\n[probe]\nenabled = false\n[daemon]\nsocket_mode = "0666"\n'


def _start_with_nofile(daemon, nofile: int, monkeypatch):
    """Start the daemon as `ulimit -n NOFILE` would (soft and hard)."""
    real_popen = subprocess.Popen

    def limited(*args, **kwargs):
        import resource

        kwargs["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        return real_popen(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", limited)
        return daemon.start()


def _hold_as(uid: int, path: str, count: int) -> tuple[int, list[str]]:
    """Fork a child that becomes `uid`, opens `count` connections and holds them; returns
    (its pid, for each connection '' = held open, else the first bytes it was answered)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            held = []
            for _ in range(count):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                held.append(sock)
            time.sleep(0.6)  # a refusal is written at once; what has nothing to read is held
            answers = []
            for sock in held:
                readable, _, _ = select.select([sock], [], [], 0)
                answers.append(sock.recv(4096).decode(errors="replace") if readable else "")
            os.write(write_end, json.dumps(answers).encode())
            os.close(write_end)
            time.sleep(60)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write_end, json.dumps([f"error {exc!r}"]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        return pid, json.loads(pipe.read())


def _end(pid: int) -> None:
    os.kill(pid, 9)
    os.waitpid(pid, 0)


def _logged(log: str, event: str) -> dict:
    return next(json.loads(line) for line in log.splitlines() if f'"{event}"' in line)


@needs_root
def test_one_idle_member_connection_never_locks_root_out_at_nofile_64(daemon_factory, public_socket, monkeypatch):
    daemon = daemon_factory(config=CONFIG)
    public_socket(daemon)
    client = _start_with_nofile(daemon, 64, monkeypatch)
    child, answers = _hold_as(MEMBER, daemon.socket, 1)
    try:
        assert len(answers) == 1 and not answers[0].startswith("error"), answers
        assert all(client.health()["gpus"] == 8 for _ in range(20)), "root is served while a member holds one"
        health = client.health()
        assert health["status"] == "degraded"
        shortfall = [reason for reason in health["degraded"] if "descriptor limit 64" in reason]
        assert shortfall and "raise LimitNOFILE" in shortfall[0], health["degraded"]
        warning = _logged(daemon.log(), "max_connections_lowered")
        assert warning["descriptor_limit"] == 64 and warning["root_reserved"] >= 1, warning
    finally:
        _end(child)


@needs_root
def test_root_is_served_through_a_members_connect_flood_at_nofile_64(daemon_factory, public_socket, monkeypatch):
    daemon = daemon_factory(config=CONFIG)
    public_socket(daemon)
    client = _start_with_nofile(daemon, 64, monkeypatch)
    flooders: list[int] = []

    def flood_as_member() -> None:
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(MEMBER)
                os.setuid(MEMBER)
                held: list[socket.socket] = []
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.setblocking(False)
                    try:
                        sock.connect(daemon.socket)
                    except OSError:
                        sock.close()
                        time.sleep(0.001)
                        continue
                    held.append(sock)
                    if len(held) > 200:
                        held.pop(0).close()
                    # Paced: a flood as fast as connect() goes fills the kernel's listen
                    # queue, which no admission policy can reach (the report's case is the
                    # daemon refusing root, not the kernel).
                    time.sleep(0.004)
            finally:
                os._exit(0)
        flooders.append(pid)

    flood_as_member()
    flood_as_member()
    try:
        time.sleep(0.5)
        served, failures = 0, []
        for _ in range(30):
            try:
                served += client.health()["gpus"] == 8
            except Exception as exc:  # noqa: BLE001 - counted: a refusal is what this test is about
                failures.append(repr(exc))
        assert served == 30, f"root served {served} of 30 in a member's flood: {failures[:3]} {daemon.log()[-2000:]}"
    finally:
        for pid in flooders:
            _end(pid)


@needs_root
def test_at_nofile_128_one_member_cannot_take_every_user_connection(daemon_factory, public_socket, monkeypatch):
    daemon = daemon_factory(config=CONFIG)
    public_socket(daemon)
    client = _start_with_nofile(daemon, 128, monkeypatch)
    first, first_answers = _hold_as(MEMBER, daemon.socket, 60)
    second = None
    try:
        second, second_answers = _hold_as(OTHER_MEMBER, daemon.socket, 5)
        assert second_answers.count("") >= 1, f"a second member got no connection: {second_answers}"
        assert client.health()["gpus"] == 8
        held = first_answers.count("")
        refused = [answer for answer in first_answers if answer]
        assert refused and all(answer.startswith("HTTP/1.1 503") for answer in refused)
        assert any("max_connections_per_uid" in answer for answer in refused)
        listening = _logged(daemon.log(), "api_listening")
        users = listening["max_connections"] - listening["root_reserved"]
        assert held == listening["per_uid"] and held < users, (held, listening)
    finally:
        _end(first)
        if second is not None:
            _end(second)


def test_the_daemon_says_how_many_connections_its_descriptor_limit_serves(daemon_factory, monkeypatch):
    daemon = daemon_factory(config=CONFIG)
    _start_with_nofile(daemon, 4096, monkeypatch)
    log = daemon.log()
    listening = _logged(log, "api_listening")
    assert (listening["max_connections"], listening["root_reserved"], listening["per_uid"]) == (256, 16, 64)
    assert "max_connections_lowered" not in log
