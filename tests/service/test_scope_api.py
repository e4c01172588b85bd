"""POST /v1/leases/{id}/scope and the lease ending with its scope (issue 28), against the
real daemon and a real D-Bus bus with a stand-in for systemd on it (fake_systemd.py):
what topod asks systemd, who may ask it, what the answer claims, and that a scope's end
(systemd's signals) ends the lease. Under the real systemd: tests/systemd/test_scope_api.py."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from topod.client import ApiError, Client
from topod.scope import bitmask


NOBODY = 65534
CONFIG = '[irq]\nmode = "off"\n[probe]\nenabled = false\n'


@pytest.fixture()
def sleeper():
    started = []

    def start() -> int:
        process = subprocess.Popen(["sleep", "120"])
        started.append(process)
        return process.pid

    yield start
    for process in started:
        process.kill()
        process.wait()


def _until(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def _place(client: Client, lease: str, body) -> dict:
    return client.request("POST", f"/v1/leases/{lease}/scope", body)


def test_a_pid_is_placed_in_its_lease_scope_and_the_scope_end_ends_the_lease(daemon_factory, systemd, sleeper):
    daemon = daemon_factory(config=CONFIG, env={"DBUS_SYSTEM_BUS_ADDRESS": systemd.address})
    client = daemon.start()
    _until(lambda: client.health()["scopes"]["watching"], "the daemon subscribed to systemd's signals")
    assert ("Subscribe", ()) in systemd.calls
    lease = client.allocate(2, cpus_per_gpu=2, job="sched-7")
    first, second = sleeper(), sleeper()

    answer = _place(client, lease["id"], {"pid": first})
    unit = f"topod-lease-{lease['id']}.scope"
    assert answer["scope"] == unit and answer["created"] is True and answer["pid"] == first
    # A fixture tree is not this host: nothing holds the CPUs, and the answer says so.
    assert answer["enforcement"] == "none" and answer["host_enforcement"] == "none"
    assert "only recorded" in answer["reason"]
    props = systemd.units[unit]["properties"]
    assert props["PIDs"] == ("au", [first])
    assert props["AllowedCPUs"] == ("ay", bitmask(lease["cpus"]))
    assert props["AllowedMemoryNodes"] == ("ay", bitmask(lease["memory_nodes"]))
    assert props["DevicePolicy"] == ("s", "closed")
    topo = {g["index"]: g for g in client.topology()["gpus"]}
    minors = [topo[i]["minor"] if topo[i]["minor"] is not None else i for i in lease["gpus"]]
    gpu_nodes = [path for path, _ in props["DeviceAllow"][1] if path.startswith("/dev/nvidia") and path[11:].isdigit()]
    assert gpu_nodes == [f"/dev/nvidia{m}" for m in sorted(minors)], "the leased GPUs' nodes and no other"
    assert "sched-7" in props["Description"][1] and lease["id"] in props["Description"][1]
    assert client.request("GET", f"/v1/leases/{lease['id']}")["scope"] == unit

    again = _place(client, lease["id"], {"pid": second})  # the lease's scope exists: joined
    assert again["created"] is False and systemd.units[unit]["pids"] == [first, second]
    assert ("AttachProcessesToUnit", (unit, "", [second])) in systemd.calls

    other = client.allocate(1, cpus_per_gpu=1)  # a lease without a scope is left alone
    # The "inactive" a unit announces while it is being created is no end (seen late under systemd 252).
    systemd.announce(unit, "inactive")
    time.sleep(0.5)
    assert lease["id"] in [l["id"] for l in client.leases()]
    systemd.end(unit)  # its last process exited: systemd's signals, no polling
    _until(lambda: all(l["id"] != lease["id"] for l in client.leases()), "the lease ends with its scope", 10)
    assert [l["id"] for l in client.leases()] == [other["id"]]

    def released() -> list[dict]:
        records = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
        return [r for r in records if r.get("event") == "lease_released" and r.get("lease") == lease["id"]]

    assert _until(released, "lease_released in the log")[0]["reason"] == f"scope {unit} ended"
    records = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    assert any(r.get("event") == "lease_scope_placed" and r.get("pid") == first for r in records)


def test_a_recorded_scope_gone_while_topod_was_down_ends_its_lease_at_start(daemon_factory, systemd, sleeper):
    daemon = daemon_factory(config=CONFIG, env={"DBUS_SYSTEM_BUS_ADDRESS": systemd.address})
    client = daemon.start()
    kept, gone = client.allocate(1, cpus_per_gpu=1), client.allocate(1, cpus_per_gpu=1)
    for lease in (kept, gone):
        _place(client, lease["id"], {"pid": sleeper()})
    daemon.stop()
    systemd.units.pop(f"topod-lease-{gone['id']}.scope")  # ended with nobody listening
    client = daemon.start()
    _until(lambda: [l["id"] for l in client.leases()] == [kept["id"]], "the lease whose scope is gone ends")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_who_may_place_what(daemon_factory, systemd, sleeper, public_socket):
    import grp

    group = grp.getgrgid(NOBODY).gr_name  # the child's gid: it may allocate
    daemon = daemon_factory(config=f'[daemon]\nsocket_mode = "0666"\ngroup = "{group}"\n' + CONFIG,
                            env={"DBUS_SYSTEM_BUS_ADDRESS": systemd.address})
    public_socket(daemon)
    client = daemon.start()
    lease = client.allocate(1, cpus_per_gpu=1)
    topod = daemon.process.pid
    for body, status, code, text in (
            ({"pid": 1}, 403, "permission_denied", "init"),
            ({"pid": 1.0}, 403, "permission_denied", "init"),  # JSON Schema's integer: 1.0 is 1
            ({"pid": topod}, 403, "permission_denied", "topod itself"),
            ({"pid": 2**22 + 1}, 400, "invalid_request", "pid_max"),
            ({"pid": "12"}, 400, "invalid_request", "integer"),
            ({"pid": True}, 400, "invalid_request", "integer"),
            ({"pid": 12, "cpus": [0]}, 400, "invalid_request", "cpus"),
            ([12], 400, "invalid_request", "object")):
        with pytest.raises(ApiError) as caught:
            _place(client, lease["id"], body)
        assert (caught.value.status, caught.value.code) == (status, code), (body, caught.value)
        assert text in str(caught.value), (body, str(caught.value))
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(ApiError) as caught:
        _place(client, lease["id"], {"pid": dead.pid})
    assert caught.value.status == 400 and "no process" in str(caught.value)
    with pytest.raises(ApiError) as caught:
        _place(client, "0" * 16, {"pid": sleeper()})
    assert caught.value.status == 404
    assert not any(call[0] in ("StartTransientUnit", "AttachProcessesToUnit") for call in systemd.calls)

    # Not root: only its own process or a descendant, and only in its own lease.
    foreign = sleeper()
    answers = _as_nobody(daemon.socket, lease["id"], foreign)
    assert "child failed" not in answers, answers
    assert answers["root's lease"][:2] == [403, "permission_denied"], answers
    assert answers["foreign pid"][:2] == [403, "permission_denied"] and "descendants" in answers["foreign pid"][2]
    assert answers["own pid"][0] == 200 and answers["own pid"][1] == "none", answers
    assert f"topod-lease-{answers['own lease']}.scope" in systemd.units
    assert f"topod-lease-{lease['id']}.scope" not in systemd.units


def _as_nobody(socket_path: str, root_lease: str, foreign_pid: int) -> dict:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            client = Client(socket_path)
            results: dict = {}

            def attempt(name: str, lease_id: str, target: int) -> None:
                try:
                    answer = client.request("POST", f"/v1/leases/{lease_id}/scope", {"pid": target})
                    results[name] = [200, answer["enforcement"], answer["scope"]]
                except ApiError as exc:
                    results[name] = [exc.status, exc.code, str(exc)]

            attempt("root's lease", root_lease, os.getpid())
            own = client.allocate(1, cpus_per_gpu=1)
            results["own lease"] = own["id"]
            attempt("foreign pid", own["id"], foreign_pid)
            attempt("own pid", own["id"], os.getpid())
            os.write(write_end, json.dumps(results).encode())
        except BaseException as exc:  # noqa: BLE001 - said to the parent, which fails on it
            os.write(write_end, json.dumps({"child failed": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(data)


def test_without_systemd_the_answer_is_503_and_said_once(daemon_factory, tmp_path, sleeper):
    daemon = daemon_factory(config=CONFIG, env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus"})
    client = daemon.start()
    lease = client.allocate(1, cpus_per_gpu=1)
    with pytest.raises(ApiError) as caught:
        _place(client, lease["id"], {"pid": sleeper()})
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    assert "no system bus" in str(caught.value)
    health = client.health()
    assert health["status"] == "ok" and health["scopes"]["bus"] == "unreachable", health["scopes"]
    assert client.request("GET", f"/v1/leases/{lease['id']}")["scope"] is None
    assert daemon.log().count('"lease_scopes_unreachable"') == 1


def test_topoctl_scope_places_a_pid_and_says_what_holds_it(daemon_factory, systemd, sleeper):
    import sys

    daemon = daemon_factory(config=CONFIG, env={"DBUS_SYSTEM_BUS_ADDRESS": systemd.address})
    client = daemon.start()
    lease = client.allocate(1, cpus_per_gpu=1)
    pid = sleeper()
    topoctl = [sys.executable, "-m", "topod.cli.topoctl", "--socket", daemon.socket]
    done = subprocess.run([*topoctl, "scope", lease["id"], str(pid)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pid {pid} in topod-lease-{lease['id']}.scope (new); enforcement none"
    assert "only recorded" in done.stderr
    assert systemd.units[f"topod-lease-{lease['id']}.scope"]["pids"] == [pid]
    refused = subprocess.run([*topoctl, "scope", "nosuchlease", str(pid)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "nosuchlease" in refused.stderr
    client.release(lease["id"])  # a lease whose scope topod made takes the scope with it
    _until(lambda: f"topod-lease-{lease['id']}.scope" not in systemd.units, "the scope stopped with its lease")
    assert ("StopUnit", (f"topod-lease-{lease['id']}.scope", "replace")) in systemd.calls
