"""Supervised loops, host state ownership and node load: the daemon's structure, in-process."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from topod.record import replace
from topod.service.load import CpuTicks, node_load, parse_cpu_ticks
from topod.service.state import HostState
from topod.service.supervise import Backoff, supervise
from topod.service.watchdog import Supervisor


def run_for(coro_factory, seconds: float):
    async def scenario():
        task = asyncio.create_task(coro_factory())
        await asyncio.sleep(seconds)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_a_loop_that_raises_is_logged_once_retried_with_backoff_and_reported():
    sup = Supervisor()
    calls, reports = [], []

    async def iteration():
        calls.append(asyncio.get_running_loop().time())
        raise OSError("sys/devices/system/cpu: gone")

    run_for(lambda: supervise(sup, "rescan", iteration, deadline=60, backoff=Backoff(0.05, 0.2),
                              report=lambda *a: reports.append(a)), 0.6)
    assert len(calls) >= 4, "retried"
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert gaps[0] < gaps[2], f"backoff grows: {gaps}"
    assert max(gaps) < 0.35, "backoff is capped"
    assert len(reports) == 1, "reported once per streak"
    name, error, where = reports[0]
    assert (name, error) == ("rescan", "OSError: sys/devices/system/cpu: gone") and "iteration" in where


def test_failures_show_in_the_report_and_a_success_clears_them():
    sup = Supervisor()
    outcomes = iter([ValueError("bad"), ValueError("bad"), None, None, None, None, None, None])

    async def iteration():
        outcome = next(outcomes, None)
        if outcome is not None:
            raise outcome
        return 0.01

    async def scenario():
        task = asyncio.create_task(supervise(sup, "irq", iteration, deadline=60, backoff=Backoff(0.01, 0.01)))
        await asyncio.sleep(0.015)
        seen_failing = dict(sup.failing())
        await asyncio.sleep(0.2)
        report = sup.report()["irq"]
        task.cancel()
        return seen_failing, report

    with structlog.testing.capture_logs() as logs:
        seen_failing, report = asyncio.run(scenario())
    assert seen_failing == {"irq": "ValueError: bad"}
    assert report["failures"] == 2 and report["failing"] is False and report["healthy"] is True
    assert [e["event"] for e in logs] == ["loop_failed", "loop_recovered"]
    assert sup.report() == {}, "a cancelled loop unregisters"


def test_a_failing_loop_is_not_stalled_but_a_hung_one_is():
    clock = [0.0]
    sup = Supervisor(clock=lambda: clock[0])
    sup.register("failing", 10)
    sup.register("hung", 10)
    clock[0] = 8.0
    sup.fail("failing", "boom")
    sup.beat("failing")  # it iterated: progress, though degraded
    clock[0] = 15.0
    assert sup.stalled() == ["hung"]
    assert sup.failing() == {"failing": "boom"}
    assert sup.degraded_text() == "degraded: failing failing (boom)"


def test_a_liveness_check_that_fails_does_not_count_as_progress():
    clock = [0.0]
    sup = Supervisor(clock=lambda: 0.0)

    async def iteration():
        raise ConnectionError("no answer")

    run_for(lambda: supervise(sup, "api", iteration, deadline=0.05, beat_on_failure=False,
                              backoff=Backoff(0.01, 0.01)), 0.1)
    # registered at t=0 and never beat: with the clock moved past the deadline it is stalled
    sup2 = Supervisor(clock=lambda: clock[0])
    token = sup2.register("api", 1.0)
    clock[0] = 2.0
    assert sup2.stalled() == ["api"]
    sup2.unregister("api", token + 1)
    assert sup2.stalled() == ["api"], "an old registration's exit cannot unregister its successor"


def test_a_rescan_of_the_same_hardware_changes_nothing(readonly_host):
    _, topology = readonly_host("h800-8gpu")
    state = HostState(topology)
    heard = []
    state.add_listener(heard.append)
    distances = state.distances
    assert state.set_discovered(replace(topology)) is False
    assert heard == [] and state.distances is distances, "the distance model (and its cache) survive"


def test_new_hardware_rebuilds_the_distances_once_and_tells_listeners(readonly_host):
    _, topology = readonly_host("h800-8gpu")
    state = HostState(topology)
    heard = []
    state.add_listener(heard.append)
    fewer = replace(topology, gpus=topology.gpus[:4])
    assert state.set_discovered(fewer) is True
    assert heard == ["hardware"] and state.topology is fewer and state.distances.topology is fewer
    assert state.set_corrections({("a", "b"): 2.0}) is True and heard[-1] == "links"
    assert state.set_corrections({("a", "b"): 2.0}) is False


def test_a_broken_listener_does_not_hide_a_change_from_the_others(readonly_host):
    _, topology = readonly_host("h800-8gpu")
    state = HostState(topology)
    heard = []
    state.add_listener(lambda kind: 1 / 0)
    state.add_listener(heard.append)
    state.set_discovered(replace(topology, gpus=topology.gpus[:2]))
    assert heard == ["hardware"]


def test_node_load_is_the_busy_share_of_each_nodes_cpus(readonly_host):
    _, topology = readonly_host("h800-8gpu")
    node0 = topology.numa_nodes[0].cpus
    before = {cpu: CpuTicks(busy=100, total=1000) for cpu in range(len(topology.cpus))}
    after = {cpu: CpuTicks(busy=100 + (90 if cpu in node0 else 10), total=1100) for cpu in before}
    load = node_load(before, after, topology)
    assert load[topology.numa_nodes[0].id] == pytest.approx(0.9)
    assert load[topology.numa_nodes[1].id] == pytest.approx(0.1)


def test_proc_stat_parsing_skips_garbage_and_counts_idle_and_iowait_as_idle():
    text = ("cpu  1 2 3 4 5 6 7 8 0 0\n"
            "cpu0 10 0 10 70 10 0 0 0 5 0\n"
            "cpu1 garbage\n"
            "cpu2 -1 0 0 0 0\n"
            "intr 12345\n")
    ticks = parse_cpu_ticks(text)
    assert ticks == {0: CpuTicks(busy=20, total=100)}
