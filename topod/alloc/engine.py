"""The allocation engine (pure): filter, then find the minimum-cost GPU set, then cores.

Levels, precisely:
- best: the set's cost equals the lowest cost any set of this size can have on this
  host (computed on the empty host, all GPUs free).
- good: the set spans the fewest NUMA nodes a set of this size can span on this host
  (one node whenever the size fits in one node): no pair crosses nodes if avoidable.
- any: the cheapest set among the free GPUs, whatever it spans.
A request at a level gets the cheapest free set that meets it, or `level_unreachable`.
Among equal-cost sets the engine takes GPUs from nodes with fewer free GPUs (packing,
so the remaining free GPUs stay together), then from less loaded nodes (back-pressure).
"""

from __future__ import annotations

from functools import lru_cache

from topod.alloc.cores import pick_cores
from topod.alloc.request import LEVEL_ESTIMATE, Decision, FreeState, GpuPick, Request, allocation_error
from topod.alloc.search import best_set
from topod.distance import DistanceModel
from topod.model import Gpu, Topology


class _Matrix:
    """Weights by position in topology.gpus, computed once per DistanceModel."""

    def __init__(self, topology: Topology, distances: DistanceModel) -> None:
        self.gpus: list[Gpu] = list(topology.gpus)
        self.position = {gpu.index: i for i, gpu in enumerate(self.gpus)}
        self.distances = [[distances.gpus(a.index, b.index) for b in self.gpus] for a in self.gpus]
        self.weight = [[d.weight for d in row] for row in self.distances]
        self.best_cost: dict[int, float] = {}
        self.min_nodes: dict[int, int] = {}


_CACHE: dict[int, tuple[DistanceModel, _Matrix]] = {}


def matrix_for(topology: Topology, distances: DistanceModel) -> _Matrix:
    key = id(distances)
    cached = _CACHE.get(key)
    if cached is None or cached[0] is not distances:
        if len(_CACHE) > 32:
            _CACHE.clear()
        cached = (distances, _Matrix(topology, distances))
        _CACHE[key] = cached
    return cached[1]


def _nodes_of(matrix: _Matrix, members) -> set:
    return {matrix.gpus[m].numa_node for m in members}


def _min_nodes(matrix: _Matrix, size: int) -> int:
    if size not in matrix.min_nodes:
        counts: dict = {}
        for gpu in matrix.gpus:
            counts[gpu.numa_node] = counts.get(gpu.numa_node, 0) + 1
        total, nodes = 0, 0
        for count in sorted(counts.values(), reverse=True):
            if total >= size:
                break
            total += count
            nodes += 1
        matrix.min_nodes[size] = max(nodes, 1)
    return matrix.min_nodes[size]


def _best_cost(matrix: _Matrix, size: int) -> float:
    if size not in matrix.best_cost:
        found = best_set(range(len(matrix.gpus)), size, matrix.weight, lambda m: 0.0)
        matrix.best_cost[size] = found[1] if found else float("inf")
    return matrix.best_cost[size]


def allocate(topology: Topology, distances: DistanceModel, state: FreeState, request: Request,
             policy=None, waited_seconds: float = 0.0) -> Decision:
    matrix = matrix_for(topology, distances)
    if request.gpus > len(matrix.gpus):
        raise allocation_error("insufficient_gpus",
                               f"{request.gpus} GPUs requested; this host has {len(matrix.gpus)}")
    required = _required(matrix, request)
    pool = [i for i, gpu in enumerate(matrix.gpus) if _eligible(gpu, request) and gpu.index not in state.busy_gpus]
    for r in required:
        if matrix.gpus[r].index in state.busy_gpus:
            raise allocation_error("insufficient_gpus", f"must_include GPU {matrix.gpus[r].index} is leased")
        if r not in pool:
            raise allocation_error("invalid_request", f"must_include GPU {matrix.gpus[r].index} does not match "
                                                      "the model/memory filter")
    if len(pool) < request.gpus:
        raise allocation_error("insufficient_gpus", f"{request.gpus} GPUs requested, {len(pool)} free and eligible")
    free_per_node: dict = {}
    for i in pool:
        node = matrix.gpus[i].numa_node
        free_per_node[node] = free_per_node.get(node, 0) + 1

    def secondary(members) -> float:
        packing = sum(free_per_node.get(matrix.gpus[m].numa_node, 0) for m in members)
        load = sum(state.node_load.get(matrix.gpus[m].numa_node, 0.0) for m in members)
        return packing * 1000 + load

    allowed = None
    if request.level == "good":
        limit = _min_nodes(matrix, request.gpus)
        allowed = lambda members: len(_nodes_of(matrix, members)) <= limit  # noqa: E731
    found = best_set(pool, request.gpus, matrix.weight, secondary, required, allowed)
    best = _best_cost(matrix, request.gpus)
    if found is None:
        raise allocation_error("level_unreachable", f"no free set of {request.gpus} GPUs meets level "
                                                    f"'{request.level}' (fewest NUMA nodes possible)")
    members, cost = found
    if request.level == "best" and cost > best + 1e-6:
        raise allocation_error("level_unreachable", f"the cheapest free set costs {cost:.2f}; level 'best' needs "
                                                    f"{best:.2f} (the host's minimum for {request.gpus} GPUs)")
    members = sorted(members, key=lambda m: matrix.gpus[m].index)
    return _decision(topology, matrix, state, request, members, cost, best)


def _required(matrix: _Matrix, request: Request) -> list[int]:
    required = []
    for item in request.must_include:
        match = [i for i, g in enumerate(matrix.gpus) if g.index == item or g.address == item or g.uuid == item]
        if not match:
            raise allocation_error("unknown_gpu", f"must_include: no GPU {item!r} on this host")
        required.append(match[0])
    return sorted(set(required))


def _eligible(gpu: Gpu, request: Request) -> bool:
    if request.min_memory_mib is not None and (gpu.memory_total_mib or 0) < request.min_memory_mib:
        return False
    if request.model is not None and request.model.lower() not in (gpu.name or "").lower():
        return False
    return True


def _decision(topology, matrix, state, request, members, cost, best) -> Decision:
    pairs = [(a, b) for i, a in enumerate(members) for b in members[i + 1:]]
    local = sum(matrix.distances[a][b].local for a, b in pairs)
    weakest = max((matrix.distances[a][b] for a, b in pairs), key=lambda d: d.weight, default=None)
    cores, reasons = pick_cores(topology, [matrix.gpus[m] for m in members], request, state)
    picks = tuple(
        GpuPick(index=g.index, address=g.address, uuid=g.uuid, numa_node=g.numa_node,
                cpus=tuple(cores[g.index][0]), cpu_node=cores[g.index][1])
        for g in (matrix.gpus[m] for m in members))
    level = "best" if cost <= best + 1e-6 else (
        "good" if len(_nodes_of(matrix, members)) <= _min_nodes(matrix, request.gpus) else "any")
    estimate = LEVEL_ESTIMATE.get(weakest.level, 0.25) if weakest else 1.0
    return Decision(picks=picks, cost=cost, best_cost=best, level=level,
                    satisfaction=(local / len(pairs)) if pairs else 1.0,
                    weakest_link=weakest.label if weakest else "X", estimate=estimate, reasons=tuple(reasons))
