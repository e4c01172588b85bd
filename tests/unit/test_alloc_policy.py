"""Policy: aging, topology weight for low-priority/short jobs, back-pressure, preemption."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from topod.alloc.engine import allocate
from topod.alloc.policy import PolicySettings, effective_priority, overload, topology_weight
from topod.alloc.preemption import plan_preemption
from topod.alloc.request import FreeState, Request
from topod.discover import discover
from topod.distance import DistanceModel
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec


@dataclass(frozen=True)
class FakeLease:
    id: str
    priority: int
    preemptible: bool
    gpus: tuple[int, ...]
    cpus: tuple[int, ...] = ()
    state: str = "active"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            topology = discover(HostRoot(build_host(load_builtin_spec(name), tmp_path_factory.mktemp(name))),
                                live_nvml=False)
            cache[name] = (topology, DistanceModel(topology))
        return cache[name]

    return get


def test_waiting_raises_priority_up_to_the_cap():
    assert effective_priority(2, 0, 60, 10) == 2
    assert effective_priority(2, 120, 60, 10) == 4
    assert effective_priority(2, 60_000, 60, 10) == 12
    assert effective_priority(2, 600, 0, 10) == 2  # aging off


def test_topology_weight_is_low_for_low_priority_and_short_jobs_and_grows_with_waiting():
    settings = PolicySettings(low_topology_weight=0.2, topology_aging_seconds=100)
    assert topology_weight(0, 0, None, settings) == 1.0
    assert topology_weight(-1, 0, None, settings) == pytest.approx(0.2)
    assert topology_weight(5, 0, 60, settings) == pytest.approx(0.2)  # short ttl
    assert topology_weight(-1, 50, None, settings) == pytest.approx(0.6)
    assert topology_weight(-1, 500, None, settings) == 1.0


def test_overload_counts_only_load_above_the_threshold():
    assert overload(0.5, 0.7) == 0.0
    assert overload(1.0, 0.7) == pytest.approx(1.0)
    assert overload(0.85, 0.7) == pytest.approx(0.5)


def test_low_priority_request_takes_fragmented_cross_numa_leftovers(host):
    topology, distances = host("pcie-8gpu")
    state = FreeState(busy_gpus=frozenset({0, 4, 5, 6}))  # leftovers 1 and 7; switch (2,3) whole
    policy = PolicySettings(low_topology_weight=0.1)
    normal = allocate(topology, distances, state, Request(gpus=2, level="any"), policy)
    assert normal.gpus == (2, 3)
    low = allocate(topology, distances, state, Request(gpus=2, level="any", priority=-1), policy)
    assert low.gpus == (1, 7) and low.satisfaction == 0.0
    assert any("fragments" in reason for reason in low.reasons)
    aged = allocate(topology, distances, state, Request(gpus=2, level="any", priority=-1), policy,
                    waited_seconds=policy.topology_aging_seconds)
    assert aged.gpus == (2, 3)


def test_backpressure_steers_to_the_less_loaded_node_when_cost_is_equal(host):
    topology, distances = host("h800-8gpu")
    node = {g.index: g.numa_node for g in topology.gpus}
    calm = allocate(topology, distances, FreeState(node_load={0: 0.5}), Request(gpus=2))
    assert {node[g] for g in calm.gpus} == {0}
    loaded = allocate(topology, distances, FreeState(node_load={0: 1.0}), Request(gpus=2))
    assert {node[g] for g in loaded.gpus} == {1}
    assert any("back-pressure" in reason for reason in loaded.reasons)


def test_backpressure_never_pays_more_than_the_tolerance(host):
    topology, distances = host("pcie-8gpu")
    # Node 1 offers only a PHB pair (30) against node 0's PIX pair (10): 3x, past 10 %.
    state = FreeState(busy_gpus=frozenset({4, 6}), node_load={0: 1.0})
    decision = allocate(topology, distances, state, Request(gpus=2))
    assert decision.gpus == (0, 1)


def test_preemption_picks_only_lower_priority_preemptible_leases(host):
    topology, distances = host("h800-8gpu")
    low = FakeLease("low", 0, True, (0, 1, 2, 3))
    equal = FakeLease("equal", 5, True, (4, 5, 6, 7))
    state = FreeState(busy_gpus=frozenset(range(8)))
    assert plan_preemption(topology, distances, state, Request(gpus=4, priority=5), [low, equal]) == (low,)
    assert plan_preemption(topology, distances, state, Request(gpus=8, priority=5, level="any"), [low, equal]) is None
    pinned = FakeLease("pinned", 0, False, (0, 1, 2, 3))
    assert plan_preemption(topology, distances, state, Request(gpus=4, priority=9), [pinned, equal]) == (equal,)
    higher = FakeLease("higher", 9, True, (0, 1, 2, 3, 4, 5, 6, 7))
    assert plan_preemption(topology, distances, state, Request(gpus=1, priority=9), [higher]) is None


def test_preemption_chooses_the_fewest_leases(host):
    topology, distances = host("h800-8gpu")
    a, b = FakeLease("a", 1, True, (0, 1)), FakeLease("b", 1, True, (2, 3))
    c = FakeLease("c", 0, True, (4, 5, 6, 7))
    state = FreeState(busy_gpus=frozenset(range(8)))
    assert plan_preemption(topology, distances, state, Request(gpus=4, priority=9), [a, b, c]) == (c,)
    assert plan_preemption(topology, distances, state, Request(gpus=2, priority=9), [a, b, c]) == (a,)


def test_no_preemption_when_the_request_already_fits(host):
    topology, distances = host("h800-8gpu")
    lease = FakeLease("low", 0, True, (0, 1, 2, 3))
    state = FreeState(busy_gpus=frozenset(lease.gpus))
    assert plan_preemption(topology, distances, state, Request(gpus=4, priority=9), [lease]) is None


def test_preemption_frees_the_victims_cpus_too(host):
    topology, distances = host("h800-8gpu")
    node0 = tuple(c.id for c in topology.cpus if c.numa_node == 0)
    node1 = tuple(c.id for c in topology.cpus if c.numa_node == 1)
    hog = FakeLease("hog", 0, True, (0,), cpus=node0)
    other = FakeLease("other", 0, True, (4, 5, 6, 7), cpus=node1)
    state = FreeState(busy_gpus=frozenset({0, 4, 5, 6, 7}), busy_cpus=frozenset(node0 + node1))
    victims = plan_preemption(topology, distances, state, Request(gpus=2, priority=3, cpus_per_gpu=2), [hog, other])
    assert victims == (hog,)
