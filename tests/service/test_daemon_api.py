"""The API as clients see it: bad input gets a clear 4xx and changes nothing; peers are
identified by SO_PEERCRED; the OpenAPI document matches what the server accepts."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest

from raw_http import exchange
from raw_http import post as _post
from topod.client import ApiError


def _raw(sock_path: str, request: bytes) -> tuple[int, dict]:
    status, _, body, _ = exchange(sock_path, request)
    return status, json.loads(body) if body.strip().startswith(b"{") else {}


BAD_REQUESTS = [
    (b"{not json", 400, "invalid_json"),
    (b"", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_request"),
    (b'{"gpus": "two"}', 400, "invalid_request"),
    (b'{"gpus": -1}', 400, "invalid_request"),
    (b'{"gpus": 0}', 400, "invalid_request"),
    (b'{"gpus": 1, "colour": "red"}', 400, "invalid_request"),
    (b'{"gpus": 1, "level": "perfect"}', 400, "invalid_request"),
    (b'{"gpus": 1, "must_include": [42]}', 400, "unknown_gpu"),
    (b'{"gpus": 9}', 409, "insufficient_gpus"),
    (b'{"gpus": 1, "ttl_seconds": 0}', 400, "invalid_request"),
    (b'{"gpus": 1, "owner_pid": 999999999}', 400, "invalid_request"),
    (b'{"gpus": 1, "cpus_per_gpu": 64}', 409, "insufficient_cpus"),
]


def test_bad_requests_get_a_clear_error_and_change_nothing(daemon_factory):
    daemon = daemon_factory()
    client = daemon.start()
    for body, status, code in BAD_REQUESTS:
        got_status, error = _raw(daemon.socket, _post("/v1/leases", body))
        assert (got_status, error.get("code")) == (status, code), body
        assert error["message"]
        assert client.leases() == [], body
    assert client.allocate(1)["gpus"], "the daemon keeps serving"


def test_unknown_routes_and_methods_are_json_errors(daemon_factory):
    daemon = daemon_factory()
    daemon.start()
    status, error = _raw(daemon.socket, b"GET /v1/nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert (status, error["code"]) == (404, "not_found")
    status, error = _raw(daemon.socket, b"PUT /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n"
                                        b"Connection: close\r\n\r\n")
    assert (status, error["code"]) == (405, "method_not_allowed")


def test_unknown_lease_is_404(daemon_factory):
    client = daemon_factory().start()
    for call in (lambda: client.lease("nope"), lambda: client.release("nope"), lambda: client.renew("nope", 5)):
        with pytest.raises(ApiError) as error:
            call()
        assert (error.value.status, error.value.code) == (404, "lease_not_found")


def test_client_disconnecting_mid_request_changes_nothing(daemon_factory):
    daemon = daemon_factory()
    client = daemon.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(daemon.socket)
        sock.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"gpus\":")
    client.allocate(8, level="any")
    client.release(client.leases()[0]["id"])
    assert client.leases() == []


def _as_user(uid: int, gid: int, code: str, sock_path: str) -> tuple[int, str]:
    """Run client code in a forked child that dropped to uid/gid; returns (status, JSON)."""
    from topod.client import Client

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges for real, then act as that user
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            c = Client(sock_path)  # noqa: F841 - used by `code`
            try:
                result = {"ok": True, "out": eval(code)}  # noqa: S307 - test-only, our own strings
            except ApiError as exc:
                result = {"ok": False, "status": exc.status, "code": exc.code}
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return status, data.decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to other uids")
def test_only_root_and_the_group_may_allocate_and_only_owners_release(daemon_factory, public_socket):
    daemon = daemon_factory(config='[daemon]\ngroup = ""\nsocket_mode = "0666"\n'
                                   '[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    # no group: nobody but root (and the daemon's own uid) may allocate (a group that does
    # not exist is a config error now, exit 78)
    public_socket(daemon)
    client = daemon.start()
    rc, out = _as_user(65534, 65534, "c.allocate(1)", daemon.socket)
    assert json.loads(out) == {"ok": False, "status": 403, "code": "permission_denied"}, out
    mine = client.allocate(1)
    rc, out = _as_user(65534, 65534, f"c.release({mine['id']!r})", daemon.socket)
    assert json.loads(out)["code"] == "permission_denied"
    rc, out = _as_user(65534, 65534, "len(c.leases())", daemon.socket)
    assert json.loads(out) == {"ok": True, "out": 1}, "reading is open to any peer that can connect"
    rc, out = _as_user(65534, 65534, f"c.request('POST', '/v1/leases/{mine['id']}/revoke')", daemon.socket)
    assert json.loads(out)["code"] == "permission_denied"
    assert [lease["id"] for lease in client.leases()] == [mine["id"]]
    assert client.leases()[0]["owner_uid"] == 0


def test_openapi_document_matches_what_the_server_accepts(daemon_factory):
    client = daemon_factory().start()
    doc = client.request("GET", "/v1/openapi.json")
    assert doc["openapi"].startswith("3.1")
    from openapi_spec_validator import validate

    validate(doc)  # a real 3.1 document: fuzzers and validators can read every operation
    for path in ("/v1/topology", "/v1/leases", "/v1/leases/{id}", "/v1/leases/{id}/renew", "/v1/events",
                 "/v1/health", "/metrics"):
        assert path in doc["paths"]
    schema = doc["components"]["schemas"]["LeaseRequest"]
    good = {"gpus": 2, "level": "good", "priority": 3, "cpus_per_gpu": 2, "job": "x", "preemptible": True}
    jsonschema.validate(good, schema)
    for bad in ({"gpus": 1, "colour": 1}, {"gpus": "1"}, {"level": "best"}, {"gpus": 1, "model": ""},
                {"gpus": 1, "job": ""}, {"gpus": 1, "job": "a\u0000b"}, {"gpus": 1, "ttl_seconds": 10**9}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(ApiError):
            client.request("POST", "/v1/leases", bad)
    lease = client.allocate(**good)
    lease_schema = {**doc["components"]["schemas"]["Lease"], "components": doc["components"]}
    jsonschema.validate(lease, lease_schema)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_unix_socket_works_as_documented(daemon_factory):
    daemon = daemon_factory()
    daemon.start()
    out = subprocess.run(["curl", "-s", "--unix-socket", daemon.socket, "-X", "POST", "-d", '{"gpus": 2}',
                          "http://topod/v1/leases"], capture_output=True, text=True, timeout=20).stdout
    lease = json.loads(out)
    assert len(lease["gpus"]) == 2
    listing = json.loads(subprocess.run(["curl", "-s", "--unix-socket", daemon.socket, "http://topod/v1/leases"],
                                        capture_output=True, text=True, timeout=20).stdout)
    assert [l["id"] for l in listing["leases"]] == [lease["id"]]
    metrics = subprocess.run(["curl", "-s", "--unix-socket", daemon.socket, "http://topod/metrics"],
                             capture_output=True, text=True, timeout=20).stdout
    assert 'topod_gpus{state="leased"} 2.0' in metrics


def test_optional_tcp_metrics_listener_and_nccl_file(daemon_factory, tmp_path):
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # In the state dir of daemon_factory's first daemon (d0): on a fixture root the host's file goes nowhere else.
    nccl = tmp_path / "d0" / "state" / "virtualTopology.xml"
    daemon = daemon_factory(config=f'[irq]\nmode = "off"\n[probe]\nenabled = false\n[export]\n'
                                   f'metrics_tcp = "{port}"\nwrite_nccl_topology = true\n'
                                   f'nccl_topology_file = "{nccl}"\n')
    client = daemon.start()
    client.allocate(3)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'topod_gpus{state="leased"} 3.0' in body
    import xml.etree.ElementTree as ET

    root = ET.fromstring(nccl.read_text())
    assert root.tag == "system" and len(root.findall(".//gpu")) == 8
    lease = client.allocate(2)
    per_lease = lease["environment"]["NCCL_TOPO_FILE"]
    assert len(ET.fromstring(open(per_lease).read()).findall(".//gpu")) == 2
    client.release(lease["id"])
    assert not os.path.exists(per_lease)


def test_picture_and_doctor_use_the_running_daemons_leases(daemon_factory, capsys):
    from topod.cli.topoctl import main as topoctl

    daemon = daemon_factory()
    client = daemon.start()
    lease = client.allocate(2, job="paint-me")
    assert topoctl(["topo", "--root", str(daemon.root), "--format", "dot", "--socket", daemon.socket]) == 0
    dot = capsys.readouterr().out
    assert lease["id"] in dot or "paint-me" in dot


def test_metrics_pass_promtool_and_carry_irq_rates(daemon_factory):
    promtool = shutil.which("promtool")
    daemon = daemon_factory(config='[irq]\nmode = "continuous"\ninterval_seconds = 0.3\n[probe]\nenabled = false\n')
    client = daemon.start()
    client.allocate(2)
    time.sleep(1.2)  # at least two IRQ cycles: rates need two snapshots
    connection_text = subprocess.run(
        ["curl", "-s", "--unix-socket", daemon.socket, "http://topod/metrics"], capture_output=True, text=True,
        timeout=20).stdout if shutil.which("curl") else None
    if connection_text is None:
        pytest.skip("curl not installed")
    assert "topod_cpu_interrupts_per_second" in connection_text
    assert "topod_allocation_decision_seconds_bucket" in connection_text
    if promtool:
        checked = subprocess.run([promtool, "check", "metrics"], input=connection_text, capture_output=True,
                                 text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def _documented_curl_commands() -> list[str]:
    """Every `curl --unix-socket` command in the code blocks of README.md and docs/api.md,
    continuation lines joined, in the order a reader meets them."""
    import re

    repo = Path(__file__).resolve().parents[2]
    commands = []
    for page in (repo / "README.md", repo / "docs" / "api.md"):
        for block in re.findall(r"^```sh\n(.*?)^```", page.read_text(), re.S | re.M):
            commands += [line.strip() for line in block.replace("\\\n", " ").splitlines()
                         if line.startswith("curl --unix-socket /run/topod/topod.sock")]
    return commands


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_every_documented_curl_example_is_answered(daemon_factory):
    """Run in order against a daemon; LEASE_ID is the lease the last POST /v1/leases got."""
    import re
    import shlex

    commands = _documented_curl_commands()
    assert len(commands) >= 6 and any("-X DELETE" in command for command in commands)
    assert any('"gpus": 0' in command for command in commands), "the pages show a lease without GPUs"
    daemon = daemon_factory()
    client = daemon.start()
    nodes = {name: device["numa_node"] for device in client.topology()["pci_devices"] for name in device["names"]}
    lease_id = None
    for command in commands:
        assert "LEASE_ID" not in command or lease_id, f"{command}: no lease granted before it"
        argv = [daemon.socket if word == "/run/topod/topod.sock" else word.replace("LEASE_ID", lease_id or "")
                for word in shlex.split(command)]
        done = subprocess.run(["curl", "-s", "-w", "\\n%{http_code}", *argv[1:]], capture_output=True, text=True,
                              timeout=20)
        body, _, status = done.stdout.rpartition("\n")
        assert done.returncode == 0 and status.startswith("2"), f"{command}: HTTP {status} {body[:300]}"
        url = next(word for word in argv if word.startswith("http://topod/"))
        if "-X POST" in command and url == "http://topod/v1/leases":
            lease = json.loads(body)
            asked = json.loads(re.search(r"-d '([^']+)'", command).group(1))
            assert len(lease["gpus"]) == asked["gpus"]
            if asked["gpus"]:
                assert len(lease["cpus"]) == asked["gpus"] * asked["cpus_per_gpu"]
            else:  # a lease without GPUs: whole cores on the node of the device it names, no GPU shown
                assert len(lease["cpus"]) == asked["cpus"]
                assert lease["memory_nodes"] == [nodes[asked["near"]]]
                assert lease["environment"]["CUDA_VISIBLE_DEVICES"] == ""
            assert lease["decision"]["level"] in ("good", "best")
            lease_id = lease["id"]



def _readme_allocate_commands() -> list[list[str]]:
    """The argv of every `topoctl allocate` line in README.md's shell blocks, its comment cut."""
    import re
    import shlex

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    found = []
    for block in re.findall(r"^```sh\n(.*?)^```", readme, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("topoctl allocate "):
                found.append(shlex.split(line, comments=True)[1:])
    return found


def test_every_allocate_in_the_readme_is_granted_on_the_demo_host(daemon_factory, capsys):
    """The README's `topoctl allocate` lines, run as shown against a daemon on the demo host:
    each is granted what it asks, a lease without GPUs on its device's node, hiding every GPU."""
    from topod.cli.topoctl import main

    commands = _readme_allocate_commands()
    assert any("--cpus" in argv and "--near" in argv for argv in commands), "README shows a lease without GPUs"
    daemon = daemon_factory()
    client = daemon.start()
    nodes = {name: device["numa_node"] for device in client.topology()["pci_devices"] for name in device["names"]}
    for argv in commands:
        capsys.readouterr()
        assert main(["--socket", daemon.socket, "--json", *argv]) == 0, f"topoctl {' '.join(argv)}"
        lease = json.loads(capsys.readouterr().out)
        asked = dict(zip(argv[1::2], argv[2::2]))
        if "--cpus" in asked:
            assert lease["gpus"] == [] and len(lease["cpus"]) == int(asked["--cpus"])
            assert lease["memory_nodes"] == [nodes[asked["--near"]]]
            assert lease["environment"]["CUDA_VISIBLE_DEVICES"] == ""
        else:
            assert len(lease["gpus"]) == int(asked["--gpus"])
        assert lease["job"] == asked.get("--job")
        client.release(lease["id"])