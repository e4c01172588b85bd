"""Leases without GPUs against the real daemon, on a fixture host with no GPU at all (a
two-socket guest, one NVMe and one NIC per node): grant, list, release, never twice,
honest errors, the ledger across a restart, IRQs kept off the leased CPUs, metrics, and
topoctl allocate/run with --cpus/--near."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_scenario import scrape_metrics

from topod.client import ApiError
from topod.cli.topoctl import main
from topod.cpulist import parse_cpulist
from topod.hostspec import build_host

REPO = Path(__file__).resolve().parents[2]
GUEST = {"name": "guest-nogpu", "pcie_gen": 3,
         "cpu": {"sockets": 2, "cores_per_socket": 2, "threads_per_core": 1, "memory_gib_per_node": 4},
         "root_complex": [{"node": 0, "devices": ["nvme", "nic"]}, {"node": 1, "devices": ["nvme", "nic"]}]}
NODE1 = {2, 3}
CONTINUOUS = '[irq]\nmode = "continuous"\ninterval_seconds = 3600.0\n[probe]\nenabled = false\n'


# Two CPUs per node: the guest keeps no housekeeping core, or each node would lease one CPU
# (housekeeping cores on a larger host: test_housekeeping_cores.py).
NO_HOUSEKEEPING = "[alloc]\nhousekeeping_cores_per_node = 0\n"
DRY_RUN = '[irq]\nmode = "dry-run"\n[probe]\nenabled = false\n'


@pytest.fixture()
def guest(daemon_factory, tmp_path):
    def make(config: str = ""):
        return daemon_factory(config=NO_HOUSEKEEPING + (config or DRY_RUN),
                              root=build_host(GUEST, tmp_path / "guest-root"))

    return make


def refused(call) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def test_a_gpu_less_host_grants_lists_and_releases_cpu_leases_never_twice(guest):
    daemon = guest()
    client = daemon.start()
    first = client.allocate(0, cpus=1, near="nvme1", ttl_seconds=600)
    assert first["gpus"] == [] and first["placements"] == [] and set(first["cpus"]) <= NODE1
    assert first["memory_nodes"] == [1] and first["decision"]["near"] == "nvme1"
    env = first["environment"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["TOPOD_GPUS"] == ""
    assert parse_cpulist(env["TOPOD_CPUS"]) == first["cpus"] and env["TOPOD_MEMORY_NODES"] == "1"
    second = client.allocate(0, cpus=1, near="node:1", ttl_seconds=600)
    assert set(second["cpus"]) == NODE1 - set(first["cpus"])
    busy = refused(lambda: client.allocate(0, cpus=1, near="nvme1"))
    assert (busy.status, busy.code, busy.retryable) == (409, "insufficient_cpus", True)
    assert sorted(lease["id"] for lease in client.leases()) == sorted([first["id"], second["id"]])
    status, text = scrape_metrics(daemon.socket)
    assert status == 200 and f"topod_leased_cpus {float(len(first['cpus']) + len(second['cpus']))}" in text
    client.release(first["id"])
    third = client.allocate(0, cpus=1, near="nvme1")
    assert third["cpus"] == first["cpus"], "a released lease's CPU is free again"
    gpu = refused(lambda: client.allocate(1))
    assert (gpu.code, gpu.retryable) == ("insufficient_gpus", False)


def test_bad_cpu_lease_requests_are_clear_and_not_retryable(guest):
    client = guest().start()
    unknown = refused(lambda: client.allocate(0, cpus=1, near="nvme9"))
    assert (unknown.status, unknown.code, unknown.retryable) == (400, "unknown_device", False)
    assert "nvme9" in str(unknown) and "nvme0, nvme1" in str(unknown) and "node:0, node:1" in str(unknown)
    node = refused(lambda: client.allocate(0, cpus=1, near="node:4"))
    assert node.code == "unknown_device" and "no NUMA node 4" in str(node)
    no_cpus = refused(lambda: client.allocate(0))
    assert (no_cpus.status, no_cpus.code) == (400, "invalid_request") and "cpus" in str(no_cpus)
    with_gpus = refused(lambda: client.allocate(1, cpus=2))
    assert with_gpus.status == 400 and "cpus_per_gpu" in str(with_gpus)
    never = refused(lambda: client.allocate(0, cpus=3, near="nvme1"))  # node 1 has two CPUs
    assert (never.status, never.code, never.retryable) == (409, "insufficient_cpus", False)
    host = refused(lambda: client.allocate(0, cpus=5, level="any"))  # the host has four
    assert (host.code, host.retryable) == ("insufficient_cpus", False)
    spread = client.allocate(0, cpus=3, near="nvme1", level="any")
    assert set(spread["cpus"]) >= NODE1 and spread["memory_nodes"] == [0, 1] and spread["decision"]["cpu_fallback"]
    assert [(l["id"], l["cpus"]) for l in client.leases()] == [(spread["id"], spread["cpus"])]


def test_a_cpu_lease_survives_a_restart_and_a_crash(guest):
    daemon = guest()
    client = daemon.start()
    lease = client.allocate(0, cpus=1, near="nvme1", ttl_seconds=600, job="loader")
    daemon.stop()
    client = daemon.start()
    (kept,) = client.leases()
    assert (kept["id"], kept["cpus"], kept["memory_nodes"], kept["job"]) == (lease["id"], lease["cpus"], [1], "loader")
    assert kept["environment"] == lease["environment"] and kept["decision"]["near"] == "nvme1"
    other = client.allocate(0, cpus=1, near="nvme1", ttl_seconds=600)
    assert not set(other["cpus"]) & set(lease["cpus"])
    daemon.stop(signal.SIGKILL)
    client = daemon.start()
    assert sorted(tuple(l["cpus"]) for l in client.leases()) == sorted([tuple(lease["cpus"]), tuple(other["cpus"])])
    full = refused(lambda: client.allocate(0, cpus=1, near="nvme1"))
    assert full.code == "insufficient_cpus", "recovered leases still hold their CPUs"


def _node1_vectors(root: Path) -> dict[int, set[int]]:
    """IRQ -> CPUs its smp_affinity_list asks for, of node 1's NVMe and NIC queues."""
    out = {}
    for line in (root / "proc" / "interrupts").read_text().splitlines()[1:]:
        irq, _, rest = line.partition(":")
        if irq.strip().isdecimal() and re.search(r"\b(nvme1q\d+|ice-ens1f0-\S+)$", rest.strip()):
            path = root / "proc" / "irq" / irq.strip() / "smp_affinity_list"
            out[int(irq)] = set(parse_cpulist(path.read_text().strip()))
    return out


def _until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_irqs_leave_a_cpu_leases_cpus_and_get_them_back(guest):
    daemon = guest(CONTINUOUS)
    client = daemon.start()
    root = daemon.root
    assert _until(lambda: client.health()["irq"].get("cycles", 0) >= 1)
    before = _node1_vectors(root)
    assert before and set().union(*before.values()) == NODE1, "spread over both node-1 CPUs"
    lease = client.allocate(0, cpus=1, near="nvme1")
    (cpu,) = lease["cpus"]
    assert _until(lambda: not any(cpu in cpus for cpus in _node1_vectors(root).values())), _node1_vectors(root)
    assert all(cpus == NODE1 - {cpu} for cpus in _node1_vectors(root).values()), "still on the device's node"
    client.release(lease["id"])
    assert _until(lambda: any(cpu in cpus for cpus in _node1_vectors(root).values())), "given back after release"


def test_topoctl_allocate_and_run_take_cpus_and_near(guest, capsys):
    daemon = guest()
    client = daemon.start()
    assert main(["allocate", "--cpus", "1", "--near", "nvme0", "--ttl", "600", "--socket", daemon.socket, "--json"]) == 0
    lease = json.loads(capsys.readouterr().out)
    assert lease["gpus"] == [] and set(lease["cpus"]) <= {0, 1} and lease["memory_nodes"] == [0]
    assert main(["allocate", "--cpus", "1", "--near", "node:1", "--socket", daemon.socket]) == 0
    text = capsys.readouterr().out
    assert re.search(r"no GPUs  cpus [23]  memory nodes 1  near node:1", text), text
    assert "CUDA_VISIBLE_DEVICES= " in text
    assert main(["allocate", "--socket", daemon.socket]) == 2
    assert "--cpus N for a lease without GPUs" in capsys.readouterr().err
    assert main(["allocate", "--cpus", "1", "--near", "eth9", "--socket", daemon.socket]) == 2  # a 400
    assert "no device 'eth9'" in capsys.readouterr().err
    for held in client.leases():
        client.release(held["id"])
    # topoctl run: the command runs on the lease's CPU (where this machine has it), sees no
    # GPU, and the lease ends with it.
    script = ("grep Cpus_allowed_list /proc/self/status; echo visible=[$CUDA_VISIBLE_DEVICES] "
              "cpus=$TOPOD_CPUS nodes=$TOPOD_MEMORY_NODES")
    env = dict(os.environ, TOPOD_SOCKET=daemon.socket, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "run", "--cpus", "1", "--near", "node:0",
                           "--", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    leased = int(re.search(r"cpus=(\d+)", done.stdout).group(1))
    assert leased in (0, 1) and "visible=[]" in done.stdout and "nodes=0" in done.stdout
    if leased in os.sched_getaffinity(0):
        allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", done.stdout).group(1)
        assert parse_cpulist(allowed) == [leased]
    assert client.leases() == [], "the lease ends with the command"


def test_a_waiting_cpu_lease_is_served_when_cpus_free_and_says_cpus_when_it_times_out(guest):
    import threading

    daemon = guest()
    client = daemon.start()
    held = [client.allocate(0, cpus=1, near="nvme1") for _ in range(2)]
    late = refused(lambda: client.allocate(0, cpus=1, near="nvme1", wait=0.3))
    assert late.code == "wait_timeout" and "no CPUs became available" in str(late)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(client.allocate(0, cpus=1, near="nvme1", wait=20)))
    waiter.start()
    assert _until(lambda: client.health()["waiting"] == 1)
    client.release(held[0]["id"])
    waiter.join(30)
    assert got and got[0]["cpus"] == held[0]["cpus"], "the queue grants the freed CPU"


def test_system_slices_leave_a_cpu_leases_cpus_and_get_them_back(systemd, daemon_factory, tmp_path):
    config = ('[irq]\nmode = "off"\n[probe]\nenabled = false\n'
              '[isolate]\nsystem = true\nmethod = "cgroup"\ninterval_seconds = 1.0\n')
    daemon = daemon_factory(config=config, env={"DBUS_SYSTEM_BUS_ADDRESS": systemd.address},
                            root=build_host(GUEST, tmp_path / "isolated-guest"))
    client = daemon.start()
    units = ("system.slice", "user.slice", "init.scope")
    lease = client.allocate(0, cpus=1, near="nvme1")
    housekeeping = tuple(sorted({0, 1, 2, 3} - set(lease["cpus"])))
    assert _until(lambda: all(systemd.allowed.get(u) == housekeeping for u in units), 20), systemd.allowed
    client.release(lease["id"])
    assert _until(lambda: all(systemd.allowed.get(u) == () for u in units), 20), systemd.allowed
