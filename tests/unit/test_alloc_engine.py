"""The allocation engine on the built-in fixture hosts and synthetic 16/32/64-GPU hosts:
optimality against brute force, level semantics, must_include, filters, errors."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from topod.alloc.engine import allocate, assess
from topod.alloc.errors import (InsufficientGpusError, InvalidRequestError, LevelUnreachableError,
                                UnknownGpuError)
from topod.alloc.request import FreeState, Request
from topod.distance import DistanceModel

FIXTURES = ("h800-8gpu", "pcie-8gpu", "nps4-8gpu", "dgx1-cubemesh")


def brute_force_min(distances: DistanceModel, candidates: list[int], k: int, must: tuple[int, ...] = ()) -> float:
    weight = {(a, b): distances.gpus(a, b).weight for a in candidates for b in candidates}
    rest = [g for g in candidates if g not in must]
    best = float("inf")
    for extra in combinations(rest, k - len(must)):
        chosen = list(must) + list(extra)
        best = min(best, sum(weight[a, b] for i, a in enumerate(chosen) for b in chosen[i + 1:]))
    return best


@pytest.mark.parametrize("name", FIXTURES)
def test_cost_equals_brute_force_minimum_for_every_size_and_busy_set(host, name):
    topology, distances = host(name)
    indices = [g.index for g in topology.gpus]
    rng = random.Random(name)
    busy_sets = [frozenset()] + [frozenset(rng.sample(indices, rng.randint(1, 4))) for _ in range(3)]
    for busy in busy_sets:
        free = [g for g in indices if g not in busy]
        for k in range(1, len(free) + 1):
            decision = allocate(topology, distances, FreeState(busy_gpus=busy), Request(gpus=k, level="any"))
            assert not set(decision.gpus) & busy
            assert len(set(decision.gpus)) == k
            assert decision.cost == pytest.approx(brute_force_min(distances, free, k), abs=1e-3)


@pytest.mark.parametrize("name", ["pcie-16gpu", "nvs-16gpu"])
def test_sixteen_gpu_hosts_are_solved_exactly(host, name):
    topology, distances = host(name)
    indices = [g.index for g in topology.gpus]
    busy = frozenset({1, 6, 9, 14})
    free = [g for g in indices if g not in busy]
    for k in (2, 3, 5, 7):
        for state, pool in ((FreeState(), indices), (FreeState(busy_gpus=busy), free)):
            decision = allocate(topology, distances, state, Request(gpus=k, level="any"))
            assert decision.exact
            assert decision.cost == pytest.approx(brute_force_min(distances, pool, k), abs=1e-3)


def test_four_gpus_at_good_stay_in_one_numa_node_on_nvswitch(host):
    topology, distances = host("h800-8gpu")
    node = {g.index: g.numa_node for g in topology.gpus}
    first = allocate(topology, distances, FreeState(), Request(gpus=4, level="good"))
    second = allocate(topology, distances, FreeState(busy_gpus=frozenset(first.gpus)), Request(gpus=4, level="good"))
    for decision in (first, second):
        assert len({node[g] for g in decision.gpus}) == 1
        assert decision.satisfaction == 1.0
    assert set(first.gpus).isdisjoint(second.gpus)


def test_good_is_unreachable_when_no_node_has_enough_free_gpus(host):
    topology, distances = host("pcie-8gpu")
    busy = frozenset({0, 4})  # one GPU taken on each node: no node has 4 free
    with pytest.raises(LevelUnreachableError) as error:
        allocate(topology, distances, FreeState(busy_gpus=busy), Request(gpus=4, level="good"))
    assert error.value.code == "level_unreachable"
    decision = allocate(topology, distances, FreeState(busy_gpus=busy), Request(gpus=4, level="any"))
    assert decision.level == "any" and decision.satisfaction < 1.0


def test_best_requires_the_host_minimum_cost(host):
    topology, distances = host("pcie-8gpu")
    # GPUs 0,2 and 4,6 busy: every free pair is split across switches (PHB), never PIX.
    busy = frozenset({0, 2, 4, 6})
    with pytest.raises(LevelUnreachableError):
        allocate(topology, distances, FreeState(busy_gpus=busy), Request(gpus=2, level="best"))
    decision = allocate(topology, distances, FreeState(busy_gpus=busy), Request(gpus=2, level="good"))
    assert decision.level == "good" and decision.cost > decision.best_cost
    best = allocate(topology, distances, FreeState(), Request(gpus=2, level="best"))
    assert best.level == "best" and best.cost == best.best_cost == distances.gpus(*best.gpus).weight


def test_eight_gpus_at_good_span_the_minimum_two_nodes(host):
    topology, distances = host("nps4-8gpu")
    decision = allocate(topology, distances, FreeState(), Request(gpus=4, level="good"))
    nodes = {topology.gpu(g).numa_node for g in decision.gpus}
    assert len(nodes) == 2
    # Two nodes of one socket (SLIT 12) beat two across sockets (SLIT 32).
    a, b = sorted(nodes)
    assert topology.slit(a, b) == min(topology.slit(x, y) for x in range(4) for y in range(4) if x != y)


def test_nvlink_pairs_win_on_the_cube_mesh(host):
    topology, distances = host("dgx1-cubemesh")
    decision = allocate(topology, distances, FreeState(), Request(gpus=2, level="best"))
    assert topology.nvlink.links_between(*decision.gpus) == 2
    assert decision.performance.weakest_pair == "NV2"


def test_nvswitch_island_is_all_to_all(host):
    topology, distances = host("h800-8gpu")
    island = topology.nvlink.islands[0]
    weights = {distances.gpus(a, b).weight for a, b in combinations(island, 2)}
    assert len(weights) == 1
    decision = allocate(topology, distances, FreeState(busy_gpus=frozenset({0, 2, 5, 7})),
                        Request(gpus=2, level="best"))
    assert decision.level == "best"  # any two free GPUs of the island are as good as the best pair


def test_equal_cost_ties_take_gpus_from_partly_used_groups(host):
    topology, distances = host("pcie-8gpu")
    # Switch (0,1) is used by GPU 0; a single GPU should come from its leftover GPU 1,
    # not break a whole free switch.
    decision = allocate(topology, distances, FreeState(busy_gpus=frozenset({0})), Request(gpus=1))
    assert decision.gpus == (1,)
    topology, distances = host("h800-8gpu")
    decision = allocate(topology, distances, FreeState(busy_gpus=frozenset({0, 1})), Request(gpus=2))
    assert {topology.gpu(g).numa_node for g in decision.gpus} == {0}


def test_must_include_is_honoured_and_resolved_by_address(host):
    topology, distances = host("pcie-8gpu")
    decision = allocate(topology, distances, FreeState(), Request(gpus=2, must_include=(5,), level="any"))
    assert 5 in decision.gpus and decision.cost == pytest.approx(10.0)  # its switch partner, PIX
    address = topology.gpu(6).address
    decision = allocate(topology, distances, FreeState(), Request(gpus=3, must_include=(address, 0), level="any"))
    assert {0, 6} <= set(decision.gpus)


def test_must_include_errors_name_the_problem(host):
    topology, distances = host("pcie-8gpu")
    with pytest.raises(UnknownGpuError) as unknown:
        allocate(topology, distances, FreeState(), Request(gpus=1, must_include=(42,)))
    assert unknown.value.code == "unknown_gpu" and "42" in str(unknown.value)
    with pytest.raises(InsufficientGpusError) as leased:
        allocate(topology, distances, FreeState(busy_gpus=frozenset({3})), Request(gpus=2, must_include=(3,)))
    assert "leased" in str(leased.value) and leased.value.retryable
    with pytest.raises(InvalidRequestError) as filtered:
        allocate(topology, distances, FreeState(), Request(gpus=1, must_include=(3,), model="H100"))
    assert filtered.value.field == "must_include"


def test_model_and_memory_filters_exclude_gpus(host):
    topology, distances = host("pcie-8gpu")
    assert allocate(topology, distances, FreeState(), Request(gpus=2, model="l40s")).gpus
    with pytest.raises(InsufficientGpusError) as wrong_model:
        allocate(topology, distances, FreeState(), Request(gpus=1, model="H100"))
    assert not wrong_model.value.retryable
    with pytest.raises(InsufficientGpusError):
        allocate(topology, distances, FreeState(), Request(gpus=1, min_memory_mib=50_000))


def test_insufficient_gpus_when_too_few_are_free(host):
    topology, distances = host("h800-8gpu")
    with pytest.raises(InsufficientGpusError) as error:
        allocate(topology, distances, FreeState(busy_gpus=frozenset(range(7))), Request(gpus=2, level="any"))
    assert error.value.code == "insufficient_gpus" and error.value.retryable
    with pytest.raises(InsufficientGpusError) as never:
        allocate(topology, distances, FreeState(), Request(gpus=9))
    assert not never.value.retryable


def test_gpu_less_host_refuses_with_insufficient_gpus(host):
    topology, distances = host("vm-nogpu")
    with pytest.raises(InsufficientGpusError) as error:
        allocate(topology, distances, FreeState(), Request(gpus=1))
    assert "no GPUs" in str(error.value)


def test_repeated_allocation_never_hands_out_a_gpu_twice(host):
    topology, distances = host("nvs-32gpu")
    busy: set[int] = set()
    rng = random.Random(5)
    while True:
        k = rng.choice([1, 2, 3, 4, 8])
        if len(busy) + k > 32:
            break
        decision = allocate(topology, distances, FreeState(busy_gpus=frozenset(busy)), Request(gpus=k, level="any"))
        assert not set(decision.gpus) & busy
        busy |= set(decision.gpus)


def test_sixty_four_gpu_host_keeps_eight_gpus_in_one_island(host):
    topology, distances = host("nvs-64gpu")
    decision = allocate(topology, distances, FreeState(busy_gpus=frozenset({0, 9, 18})), Request(gpus=8, level="best"))
    island = topology.nvlink.island_of(decision.gpus[0])
    assert set(decision.gpus) == set(island) and decision.exact
    decision = allocate(topology, distances, FreeState(), Request(gpus=32, level="good"))
    assert len({topology.gpu(g).numa_node for g in decision.gpus}) == 4 and decision.exact


def test_decision_json_has_what_the_service_reads(host):
    topology, distances = host("h800-8gpu")
    body = allocate(topology, distances, FreeState(), Request(gpus=2, cpus_per_gpu=2)).to_json()
    assert body["gpus_indices"] == [g["index"] for g in body["gpus"]]
    assert sorted(body["cpus"]) == sorted(c for g in body["gpus"] for c in g["cpus"])
    assert body["memory_nodes"] == [0] and body["level"] == "best" and body["satisfaction"] == 1.0
    assert body["performance"]["relative_allreduce_bandwidth"] == 1.0
    assert set(body["performance"]["level_floors"]) == {"best", "good", "any"}


def test_performance_estimate_falls_with_the_weakest_pair(host):
    topology, distances = host("pcie-8gpu")
    near = allocate(topology, distances, FreeState(), Request(gpus=2, level="best"))
    far = allocate(topology, distances, FreeState(busy_gpus=frozenset({1, 2, 3, 5, 6, 7})),
                   Request(gpus=2, level="any"))
    assert near.performance.relative_bandwidth == 1.0
    assert far.performance.weakest_pair == "SYS" and far.performance.relative_bandwidth < 0.4
    assert far.performance.level_floors["any"] == pytest.approx(far.performance.relative_bandwidth)


def test_assess_judges_another_allocators_set(host):
    topology, distances = host("pcie-8gpu")
    assert assess(topology, distances, [0, 1]).level == "best"
    assert assess(topology, distances, [0, 2]).level == "good"
    crossing = assess(topology, distances, [0, 4])
    assert crossing.level == "any" and crossing.satisfaction == 0.0
