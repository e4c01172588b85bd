"""The engine's per-decision computations that have shortcuts (phi per group kind, counted
by bit masks) give the values the plain per-GPU formula gives, to the bit, on seeded
random busy sets: a decision that has to be computed picks what it picked before."""

from __future__ import annotations

import random

import pytest

from topod.alloc import engine
from topod.alloc.engine import DEFAULT_POLICY
from topod.alloc.packing import cheapest_one, group_index, group_kinds, phi_of
from topod.alloc.errors import AllocationError
from topod.alloc.hostview import host_view
from topod.alloc.policy import PolicySettings, backpressure_penalty
from topod.alloc.request import FreeState, Request
from topod.alloc.search import solve_one
from topod.alloc.viewsearch import search_view


def _phi_per_gpu(view, busy: set[int]) -> list[float]:
    """The packing phi by its definition, one GPU at a time (the formula the engine had)."""
    members, sizes = group_index(view)
    free_in = list(sizes)
    for p in busy:
        for i in members[p]:
            free_in[i] -= 1
    share = [count / size for count, size in zip(free_in, sizes)]
    return [sum(share[i] for i in groups) / len(groups) if groups else 1.0 for groups in members]


@pytest.mark.parametrize("name", ["h800-8gpu", "pcie-8gpu", "nps4-8gpu", "dgx1-cubemesh", "pcie-16gpu",
                                  "nvs-16gpu", "pcie-64gpu"])
def test_phi_equals_the_per_gpu_formula_on_random_busy_sets(host, name):
    topology, distances = host(name)
    view = host_view(topology, distances)
    rng = random.Random(26)
    for step in range(200):
        busy = set(rng.sample(range(view.n), rng.randrange(view.n + 1)))
        view.cache.get("phi", {}).clear()  # computed now, not remembered
        if step % 2:
            for known in group_kinds(view)[4]:
                known.clear()  # every kind's phi computed now too (else some are the memo's)
        assert phi_of(view, busy) == _phi_per_gpu(view, busy)


@pytest.mark.parametrize("name", ["pcie-8gpu", "pcie-16gpu", "nvs-16gpu", "pcie-64gpu", "nvs-64gpu"])
def test_cheapest_one_picks_what_solve_one_picks(host, name):
    """The 1-GPU shortcut against the general one-GPU solver on the per-GPU terms, on
    random busy sets, packing weights (some ties after rounding) and node caps."""
    topology, distances = host(name)
    view = host_view(topology, distances)
    rng = random.Random(261)
    nodes = sorted(set(view.node))
    for _ in range(300):
        busy = set(rng.sample(range(view.n), rng.randrange(view.n + 1)))
        free = [p for p in range(view.n) if p not in busy]
        weight = rng.choice((1e-7, 1e-7 + rng.random(), 3.0, 1e-300))
        node_cap = rng.choice((None, {v: rng.choice((0, 0, 1, 2)) for v in nodes},
                               {v: 1 for v in rng.sample(nodes, len(nodes) // 2)}))  # absent: room
        phi = phi_of(view, busy)
        expected = solve_one(free, {p: weight * phi[p] for p in free}, view.node, node_cap)
        assert cheapest_one(view, busy, weight, node_cap) == expected


def test_one_gpu_decisions_on_64_gpus_equal_the_general_search(host):
    """Whole decisions: the 1-GPU shortcut against the same decision with the shortcut
    off (the general search), on random free states of the 64-GPU host."""
    topology, distances = host("pcie-64gpu")
    view = host_view(topology, distances)
    rng = random.Random(2626)
    taken = 0
    for _ in range(150):
        state = FreeState(busy_gpus=frozenset(rng.sample([g.index for g in topology.gpus], rng.randrange(64))),
                          busy_cpus=frozenset(rng.sample(range(128), rng.randrange(0, 100))),
                          node_load=rng.choice(({}, {v: rng.random() * 0.7 for v in range(8)},  # calm
                                                {v: rng.random() for v in range(8)})))  # some overloaded
        request = Request(gpus=1, level=rng.choice(("any", "good")), cpus_per_gpu=rng.choice((0, "auto", 2, 8)),
                          priority=rng.choice((0, -1)))
        tau = rng.choice((1.0, 0.25))
        quick = _outcome(lambda: engine._decide(view, state, request, DEFAULT_POLICY, tau))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine, "cheapest_one", _general_one)
            general = _outcome(lambda: engine._decide(view, state, request, DEFAULT_POLICY, tau))
        assert quick == general
        taken += bool(calls)
        calls.clear()
    assert taken > 50  # the shortcut was taken (else this compares the general path with itself)


calls: list[int] = []


def _general_one(view, busy, weight, node_cap):
    """What the engine's search does for one GPU, given the per-GPU terms."""
    calls.append(1)
    free = [p for p in range(view.n) if p not in busy]
    unary = engine._unary(view, busy, free, weight, ())
    return search_view(view, free, set(), unary, node_cap, None, 1, DEFAULT_POLICY.search_budget, busy)


def _outcome(decide):
    try:
        return decide()
    except AllocationError as error:
        return type(error).__name__, str(error)


def test_calm_exactly_when_back_pressure_has_no_penalty():
    """_calm lets the engine skip back-pressure: it must hold exactly when the penalty
    is empty, on random loads (edges included: at the threshold, outside [0, 1], NaN)."""
    rng = random.Random(2627)
    for _ in range(2000):
        policy = rng.choice((DEFAULT_POLICY, PolicySettings(backpressure_threshold=rng.choice((0.0, 0.5, 1.0, 1.5))),
                             PolicySettings(backpressure_tolerance=0.0)))
        values = (0.0, 0.69, 0.7, 0.71, 1.0, 1.2, -0.3, float("nan"), policy.backpressure_threshold)
        load = {v: rng.choice(values) if rng.random() < 0.5 else rng.random() for v in range(rng.randrange(5))}
        state = FreeState(node_load=load)
        assert engine._calm(state, policy) == (not backpressure_penalty(load, 1.0, 1.0, 1, policy)), load
