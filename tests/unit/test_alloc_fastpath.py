"""The engine's fast path (its memos of decisions and searches, keyed by value and by the
problem's shape; prepare()'s decisions of the empty host; the free-core and NIC tables)
gives the placements the whole computation gives, and the sets it grants are the
exhaustive minimum, on seeded random request streams over the built-in hosts."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from topod.alloc.engine import allocate, prepare
from topod.alloc.errors import AllocationError
from topod.alloc.hostview import host_view
from topod.alloc.reference import good_node_limit
from topod.alloc.request import FreeState, Request
from topod.distance import DistanceModel

BUILTIN_8 = ("h800-8gpu", "pcie-8gpu", "nps4-8gpu", "dgx1-cubemesh")


def _stream(topology, seed: int, steps: int):
    """(state, request) pairs of a random allocate/release stream; the caller grants."""
    rng = random.Random(seed)
    indices = [g.index for g in topology.gpus]
    n = len(indices)
    held: list[tuple[tuple[int, ...], frozenset[int]]] = []
    busy: set[int] = set()
    cpus: set[int] = set()
    for _ in range(steps):
        if held and (rng.random() < 0.4 or len(busy) > 0.75 * n):
            gpus, taken = held.pop(rng.randrange(len(held)))
            busy -= set(gpus)
            cpus -= taken
            continue
        request = Request(gpus=min(n, rng.choice((1, 1, 2, 2, 3, 4, 4, 8))), level=rng.choice(("good", "good", "any")),
                          cpus_per_gpu=rng.choice(("auto", "auto", 0, 2, 8, 16)),
                          must_include=(rng.choice(indices),) if rng.random() < 0.1 else (),
                          priority=rng.choice((0, 0, -1)))  # -1: packing weighs more (policy)
        decision = yield FreeState(busy_gpus=frozenset(busy), busy_cpus=frozenset(cpus)), request
        if decision is not None:
            taken = frozenset(c for group in decision.cpus.values() for c in group)
            busy |= set(decision.gpus)
            cpus |= taken
            held.append((decision.gpus, taken))


def _decide(topology, distances, state, request):
    try:
        return allocate(topology, distances, state, request)
    except AllocationError as error:
        return type(error).__name__, str(error)


def _computed(topology, distances, state, request):
    """The same request on a second model whose memos are emptied first: computed whole."""
    view = host_view(topology, distances)
    view.decision_memo.clear()
    view.search_memo.clear()
    return _decide(topology, distances, state, request)


@pytest.mark.parametrize("name", [*BUILTIN_8, "nvs-16gpu", "pcie-16gpu"])
def test_memoised_decisions_equal_decisions_computed_whole(host, name):
    topology, _ = host(name)
    warm = DistanceModel(topology)  # prepared, memos kept: the daemon's engine
    cold = DistanceModel(topology)
    prepare(topology, warm)
    hits = 0
    for seed in (1, 2):
        stream = _stream(topology, seed, 160 if "16" in name else 260)
        state, request = next(stream)
        try:
            while True:
                before = len(host_view(topology, warm).decision_memo)
                fast = _decide(topology, warm, state, request)
                again = _decide(topology, warm, state, request)
                assert again == fast  # asked again: the memo's answer, the same
                hits += len(host_view(topology, warm).decision_memo) == before and not isinstance(fast, tuple)
                assert _computed(topology, cold, state, request) == fast, (state, request)
                state, request = stream.send(None if isinstance(fast, tuple) else fast)
        except StopIteration:
            pass
    assert hits > 0  # some decisions of the stream were answered from the memo, and matched


def _search_cost(view, members) -> float:
    w = view.search_weight
    return sum(w[a][b] for i, a in enumerate(members) for b in members[i + 1:])


@pytest.mark.parametrize("name", BUILTIN_8)
def test_granted_sets_cost_the_exhaustive_minimum(host, name):
    """Without CPUs (no node caps), every grant's search cost (pair weights and the
    node-crossing term) is the least over every k-set of the free GPUs that holds the
    must_include GPU and, at level good, spans no more nodes than good allows; the
    tie-break terms (packing, NICs) are below 1e-6 for these sizes."""
    topology, distances = host(name)
    prepare(topology, distances)
    view = host_view(topology, distances)
    position = view.position
    checked = 0
    stream = _stream(topology, 7, 300)
    state, request = next(stream)
    try:
        while True:
            request = Request(gpus=request.gpus, level=request.level, must_include=request.must_include)  # priority 0
            fast = _decide(topology, distances, state, request)
            if not isinstance(fast, tuple):
                free = [p for p in range(view.n) if view.gpus[p].index not in state.busy_gpus]
                must = {position[g] for g in request.must_include}
                limit = good_node_limit(view, request.gpus, list(range(view.n)), must)
                best = min(_search_cost(view, list(s)) for s in combinations(free, request.gpus)
                           if must <= set(s) and (request.level == "any" or len({view.node[p] for p in s}) <= limit))
                chosen = _search_cost(view, [position[g] for g in fast.gpus])
                assert chosen == pytest.approx(best, abs=1e-6), (state, request, fast.gpus)
                checked += 1
            state, request = stream.send(None if isinstance(fast, tuple) else fast)
    except StopIteration:
        pass
    assert checked > 50


@pytest.mark.parametrize("name", [*BUILTIN_8, "pcie-16gpu"])
def test_after_prepare_the_first_decision_of_each_size_is_an_answer_prepare_made(host, name):
    topology, _ = host(name)
    distances = DistanceModel(topology)
    view = prepare(topology, distances)
    made = len(view.decision_memo)
    cold = DistanceModel(topology)
    for k in (1, 2, 4, 8, len(topology.gpus)):
        request = Request(gpus=k, cpus_per_gpu="auto")
        first = allocate(topology, distances, FreeState(), request)
        assert first == allocate(topology, cold, FreeState(), request)
    assert len(view.decision_memo) == made  # none of them computed anew
