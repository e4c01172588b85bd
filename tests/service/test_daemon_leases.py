"""The real daemon over its real socket: leases, concurrency, restarts, owners, preemption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from topod.client import ApiError, Client


def _wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_two_allocations_get_disjoint_gpus_with_near_cores(daemon_factory):
    client = daemon_factory().start()
    first = client.allocate(4, level="good", cpus_per_gpu=4)
    second = client.allocate(4, level="good", cpus_per_gpu=4)
    assert set(first["gpus"]).isdisjoint(second["gpus"])
    assert not set(first["cpus"]) & set(second["cpus"])
    topo = client.topology()
    node_of_gpu = {g["index"]: g["numa_node"] for g in topo["gpus"]}
    node_of_cpu = {c["id"]: c["numa_node"] for c in topo["cpus"]}
    for lease in (first, second):
        nodes = {node_of_gpu[g] for g in lease["gpus"]}
        assert len(nodes) == 1, "a 4-GPU lease at level good stays in one NUMA node"
        assert {node_of_cpu[c] for c in lease["cpus"]} == nodes
        assert lease["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert lease["environment"]["TOPOD_LEASE"] == lease["id"]
    assert sorted(lease["id"] for lease in client.leases()) == sorted([first["id"], second["id"]])
    client.release(first["id"])
    assert [lease["id"] for lease in client.leases()] == [second["id"]]


def test_concurrent_clients_never_get_the_same_gpu(daemon_factory):
    daemon = daemon_factory()
    daemon.start()
    granted, refused = [], []
    lock = threading.Lock()

    def one():
        try:
            lease = Client(daemon.socket).allocate(1, level="any")
            with lock:
                granted.append(lease)
        except ApiError as exc:
            with lock:
                refused.append(exc.code)

    threads = [threading.Thread(target=one) for _ in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gpus = [g for lease in granted for g in lease["gpus"]]
    assert len(gpus) == 8 and len(set(gpus)) == 8
    assert len(refused) == 16 and set(refused) == {"insufficient_gpus"}


def test_restart_keeps_every_acknowledged_lease(daemon_factory):
    daemon = daemon_factory()
    client = daemon.start()
    leases = [client.allocate(2, level="good") for _ in range(3)]
    assert daemon.stop() == 0
    client = daemon.start()
    after = {lease["id"]: lease["gpus"] for lease in client.leases()}
    assert after == {lease["id"]: lease["gpus"] for lease in leases}
    fourth = client.allocate(2, level="any")
    assert set(fourth["gpus"]).isdisjoint(g for lease in leases for g in lease["gpus"])


def test_lease_ends_when_its_owner_process_exits(daemon_factory):
    client = daemon_factory().start()
    owner = subprocess.Popen(["sleep", "30"])
    client.allocate(2, owner_pid=owner.pid)
    owner.kill()
    owner.wait()
    assert _wait_until(lambda: not client.leases(), timeout=5)


def test_dead_owners_leases_are_reclaimed_at_start(daemon_factory):
    daemon = daemon_factory()
    client = daemon.start()
    owner = subprocess.Popen(["sleep", "30"])
    client.allocate(2, owner_pid=owner.pid)
    keeper = client.allocate(1)
    daemon.stop(signal.SIGKILL)
    owner.kill()
    owner.wait()
    client = daemon.start()
    assert [lease["id"] for lease in client.leases()] == [keeper["id"]]


def test_ttl_lease_expires_and_renew_extends_it(daemon_factory):
    client = daemon_factory().start()
    short = client.allocate(1, ttl_seconds=1.0)
    kept = client.allocate(1, ttl_seconds=1.0)
    client.renew(kept["id"], ttl_seconds=60)
    assert _wait_until(lambda: [lease["id"] for lease in client.leases()] == [kept["id"]], timeout=5)
    assert short["id"] not in {lease["id"] for lease in client.leases()}


def test_waiting_request_is_granted_when_gpus_free_up(daemon_factory):
    daemon = daemon_factory()
    client = daemon.start()
    holder = client.allocate(8, level="any")
    result = {}

    def wait_for_gpus():
        result["lease"] = Client(daemon.socket).allocate(4, level="good", wait=10)

    thread = threading.Thread(target=wait_for_gpus)
    thread.start()
    time.sleep(0.3)
    assert "lease" not in result
    client.release(holder["id"])
    thread.join(timeout=10)
    assert len(result["lease"]["gpus"]) == 4


def test_fail_fast_and_wait_timeout_are_clear_errors(daemon_factory):
    client = daemon_factory().start()
    client.allocate(8)
    with pytest.raises(ApiError) as fast:
        client.allocate(1)
    assert fast.value.status == 409 and fast.value.code == "insufficient_gpus"
    with pytest.raises(ApiError) as slow:
        client.allocate(1, wait=0.3)
    assert slow.value.code == "wait_timeout"


def test_gentle_preemption_waits_for_the_holder_then_grants(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[alloc]\npreemption_grace_seconds = 30\n')
    client = daemon.start()
    low = client.allocate(8, priority=0, preemptible=True, job="low")
    events = []
    watcher = threading.Thread(target=lambda: events.extend(_take(Client(daemon.socket).events(), 2)), daemon=True)
    watcher.start()
    time.sleep(0.2)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault(
        "lease", Client(daemon.socket).allocate(4, priority=10, level="good", wait=10)))
    thread.start()
    assert _wait_until(lambda: any(lease["state"] == "preempting" for lease in client.leases()))
    assert "lease" not in result, "no revocation before the holder releases or the grace ends"
    client.release(low["id"])
    thread.join(timeout=10)
    assert len(result["lease"]["gpus"]) == 4
    watcher.join(timeout=5)
    names = [event["event"] for event in events]
    assert "preemption_requested" in names


def test_preemption_never_touches_equal_priority(daemon_factory):
    client = daemon_factory().start()
    client.allocate(8, priority=5, preemptible=True)
    with pytest.raises(ApiError) as refused:
        client.allocate(2, priority=5, wait=0.5)
    assert refused.value.code == "wait_timeout"
    assert all(lease["state"] == "active" for lease in client.leases())


def test_preemption_deadline_revokes_the_lease(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[alloc]\npreemption_grace_seconds = 0.5\n')
    client = daemon.start()
    client.allocate(8, priority=0, preemptible=True)
    lease = client.allocate(2, priority=9, wait=10)
    assert len(lease["gpus"]) == 2
    assert [l["id"] for l in client.leases()] == [lease["id"]]


def _take(iterator, count):
    out = []
    for item in iterator:
        out.append(item)
        if item["event"] == "preemption_requested" or len(out) >= count + 5:
            break
    return out


def test_sighup_with_broken_config_keeps_serving_with_the_old_one(daemon_factory):
    daemon = daemon_factory()
    client = daemon.start()
    lease = client.allocate(2)
    daemon.config_path.write_text("[irq]\nmode = 'sometimes'\n")
    daemon.process.send_signal(signal.SIGHUP)
    assert _wait_until(lambda: client.health()["config_error"] is not None)
    assert "irq.mode" in client.health()["config_error"]
    assert [l["id"] for l in client.leases()] == [lease["id"]]
    daemon.config_path.write_text("[irq]\nmode = 'off'\n[probe]\nenabled = false\n[alloc]\nreserved_cpus = '1'\n")
    daemon.process.send_signal(signal.SIGHUP)
    assert _wait_until(lambda: client.health()["config_error"] is None)
    assert [l["id"] for l in client.leases()] == [lease["id"]]
    assert 1 not in client.allocate(1, cpus_per_gpu=2)["cpus"], "the reloaded reserved CPUs apply"


def test_topoctl_run_pins_the_command_passes_its_exit_code_and_releases(daemon_factory, tmp_path):
    import sys

    daemon = daemon_factory()
    client = daemon.start()
    out = tmp_path / "seen.json"
    script = ("import json, os, sys; json.dump({'cpus': sorted(os.sched_getaffinity(0)), "
              "'lease': os.environ['TOPOD_LEASE'], 'cuda': os.environ['CUDA_VISIBLE_DEVICES'], "
              "'leased_cpus': os.environ['TOPOD_CPUS'], "
              f"'leases_during': 0}}, open({str(out)!r}, 'w')); sys.exit(7)")
    env = dict(os.environ, TOPOD_SOCKET=daemon.socket, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "run", "--gpus", "2", "--cpus-per-gpu", "2",
                           "--", sys.executable, "-c", script], env=env, timeout=60)
    assert done.returncode == 7
    seen = json.loads(out.read_text())
    from topod.cpulist import parse_cpulist

    leased = parse_cpulist(seen["leased_cpus"])
    assert len(leased) == 4 and len(seen["cuda"].split(",")) == 2
    # the fixture's CPU ids are not all real here: the kernel keeps the ones that exist
    assert set(seen["cpus"]) == set(leased) & os.sched_getaffinity(0)
    assert client.leases() == [], "the lease ends with the command"


def test_topoctl_run_without_cpus_says_so_and_binds_no_memory(daemon_factory, tmp_path):
    import sys

    daemon = daemon_factory()
    daemon.start()
    out = tmp_path / "seen.json"
    script = ("import json, os; json.dump({'cpus': sorted(os.sched_getaffinity(0)), "
              f"'maps': open('/proc/self/numa_maps').read()}}, open({str(out)!r}, 'w'))")
    env = dict(os.environ, TOPOD_SOCKET=daemon.socket, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "run", "--gpus", "1", "--cpus-per-gpu", "0",
                           "--", sys.executable, "-c", script], env=env, timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "pins no CPUs" in done.stderr and "not bound" in done.stderr
    seen = json.loads(out.read_text())
    assert set(seen["cpus"]) == os.sched_getaffinity(0), "left unpinned"
    assert " bind:" not in seen["maps"], "and no memory policy without CPU binding"


@pytest.mark.parametrize("held, expected", [((0, 3), 7), ((0,), 1)])
def test_a_one_gpu_grant_on_a_cube_mesh_weighs_which_gpus_each_lease_holds(daemon_factory, held, expected):
    """The daemon hands the engine its lease partition: with GPUs 0, 3 and 4 busy, a
    single GPU goes beside the lone lease on GPU 4 (7) when {0, 3} is one lease, so that
    pair's socket comes back whole when it ends; when 0 and 3 are leases of their own it
    goes beside them (1). Same busy GPUs, same cost: only the partition differs."""
    client = daemon_factory("dgx1-cubemesh").start()
    if len(held) == 2:
        assert sorted(client.allocate(2, must_include=list(held), level="any", cpus_per_gpu=0)["gpus"]) == [0, 3]
    else:
        for gpu in (0, 3):
            assert client.allocate(1, must_include=[gpu], level="any", cpus_per_gpu=0)["gpus"] == [gpu]
    assert client.allocate(1, must_include=[4], level="any", cpus_per_gpu=0)["gpus"] == [4]
    assert client.allocate(1, level="any", cpus_per_gpu=0)["gpus"] == [expected]
