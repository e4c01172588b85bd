"""Over the real socket: a request no release could ever satisfy is refused at once with
retryable false (topoctl exits 1), whatever resource is short, wait or no wait; one that
fits later stays retryable (topoctl 75); [alloc] max_gpus_per_uid refuses with 409
uid_quota carrying held/asked/cap, counted in /metrics and listed in the OpenAPI document.
The h800 fixture host: 8 GPUs, two NUMA nodes of 32 CPUs, 8 RDMA NIC ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon_scenario import check_metrics
from raw_http import exchange, post

REPO = Path(__file__).resolve().parents[2]
NO_PROBES = '[irq]\nmode = "off"\n[probe]\nenabled = false\n'


def topoctl(socket: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "--socket", socket, *args],
                          capture_output=True, text=True, timeout=60, env=env)


def allocate_raw(socket: str, body: dict) -> tuple[int, dict, float]:
    """(status, answer, seconds it took) of one POST /v1/leases."""
    started = time.monotonic()
    status, _, _, text = exchange(socket, post("/v1/leases", json.dumps(body).encode()), timeout=30)
    return status, json.loads(text), time.monotonic() - started


@pytest.mark.parametrize(("body", "code", "says"), [
    ({"gpus": 9}, "insufficient_gpus", "this host has 8"),
    ({"gpus": 1, "model": "A100"}, "insufficient_gpus", "0 matching"),
    ({"gpus": 1, "cpus_per_gpu": 1000}, "insufficient_cpus", "cpus_per_gpu 1000"),
    # 32 CPUs a node, less its housekeeping core (both hyper-threads)
    ({"gpus": 1, "cpus_per_gpu": 64, "level": "any"}, "insufficient_cpus", "30 (node 0)"),
    ({"gpus": 1, "nics_per_gpu": 9}, "insufficient_nics", "8 RDMA NIC port(s) in all"),
])
def test_a_never_satisfiable_request_with_a_wait_is_answered_at_once_not_retryable(daemon_factory, body, code, says):
    daemon = daemon_factory(config=NO_PROBES)
    daemon.start()
    status, answer, took = allocate_raw(daemon.socket, {**body, "wait": 3})
    assert (status, answer["code"], answer["retryable"]) == (409, code, False), answer
    assert says in answer["message"]
    assert took < 2.5, f"answered after {took:.1f} s: it waited out its 3 s"


def test_topoctl_exits_1_for_never_and_75_for_later(daemon_factory):
    daemon = daemon_factory(config=NO_PROBES)
    client = daemon.start()
    started = time.monotonic()
    never = topoctl(daemon.socket, "allocate", "--gpus", "1", "--cpus-per-gpu", "64", "--wait", "3")
    assert never.returncode == 1 and "cpus_per_gpu 64" in never.stderr, never
    assert time.monotonic() - started < 2.8 + 2.0  # topoctl's own start-up is most of it
    client.allocate(8, level="any", cpus_per_gpu=0)
    # Every GPU is leased: a request that fits the empty host is refused now, retryable
    status, answer, _ = allocate_raw(daemon.socket, {"gpus": 1, "cpus_per_gpu": 16})
    assert (status, answer["code"], answer["retryable"]) == (409, "insufficient_gpus", True), answer
    later = topoctl(daemon.socket, "allocate", "--gpus", "1", "--cpus-per-gpu", "16")
    assert later.returncode == 75, later
    still_never = topoctl(daemon.socket, "allocate", "--gpus", "1", "--cpus-per-gpu", "64")
    assert still_never.returncode == 1, "a busy host does not make the impossible retryable"


def _as_member(socket: str, bodies: list[dict]) -> list[tuple[int, dict]]:
    """POST each body as uid/gid 65534 (a member of the daemon's group, nogroup), in a
    forked child that dropped to it; the answers in order."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            out = []
            for body in bodies:
                status, _, _, text = exchange(socket, post("/v1/leases", json.dumps(body).encode()), timeout=30)
                out.append([status, json.loads(text)])
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return [tuple(row) for row in json.loads(data)]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to ask as another uid")
def test_a_member_over_max_gpus_per_uid_gets_uid_quota_with_its_numbers(daemon_factory, public_socket):
    daemon = daemon_factory(config='[daemon]\ngroup = "nogroup"\nsocket_mode = "0666"\n'
                                   '[alloc]\nmax_gpus_per_uid = 2\ncpus_per_gpu = 0\n' + NO_PROBES)
    public_socket(daemon)
    client = daemon.start()
    (granted, again, too_big) = _as_member(daemon.socket, [{"gpus": 2}, {"gpus": 1, "wait": 0}, {"gpus": 3, "wait": 5}])
    assert granted[0] == 201, granted
    assert again == (409, {"code": "uid_quota", "message": again[1]["message"], "retryable": True,
                           "held": 2, "asked": 1, "cap": 2, "uid": 65534}), again
    assert "holds 2 GPU(s)" in again[1]["message"] and "max_gpus_per_uid = 2" in again[1]["message"]
    assert too_big[0] == 409 and too_big[1]["code"] == "uid_quota" and too_big[1]["retryable"] is False, too_big
    assert (too_big[1]["held"], too_big[1]["asked"], too_big[1]["cap"]) == (2, 3, 2)
    assert len(client.allocate(4)["gpus"]) == 4, "root is not held to a member's cap"
    metrics = check_metrics(daemon.socket)
    assert 'topod_gpu_cap{group="",scope="uid"} 2.0' in metrics
    assert 'topod_allocation_requests_total{reason="uid_quota",result="rejected"} 2.0' in metrics
    document = client.request("GET", "/v1/openapi.json")
    errors = document["paths"]["/v1/leases"]["post"]["responses"]["409"]["description"]
    assert "uid_quota" in errors and "group_quota" in errors
    assert {"held", "asked", "cap"} <= set(document["components"]["schemas"]["Error"]["properties"])
