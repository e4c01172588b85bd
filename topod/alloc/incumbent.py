"""The branch and bound's starting point (topod.alloc.search): a good k-set found fast,
whose objective prunes the search from its first node and whose classes order it.

Greedy growth, from no seed and from the most promising single classes (each class's own
term plus half its cheapest partners), then one-GPU moves between classes while the best
move lowers the objective. The same constraints as the search: class sizes, must-include
minimums, per-node capacity and the node limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topod.alloc.search import Problem

SEEDS = 4  # single-class seeds tried besides none (at most a quarter of the classes)


def class_neighbours(problem: Problem, cap: list[int]) -> list[list[tuple[float, int, int]]]:
    """Per class, its partners cheapest first: (weight, how many GPUs, class), itself
    included when it has a second GPU."""
    m = len(cap)
    out = []
    for d in range(m):
        row = [(problem.inter[d][e], cap[e], e) for e in range(m) if e != d]
        if cap[d] > 1:
            row.append((problem.intra[d], cap[d] - 1, d))
        row.sort()
        out.append(row)
    return out


def _partner_sum(row: list[tuple[float, int, int]], need: int) -> float:
    """Sum of the `need` cheapest partner weights in a class's row (class_neighbours)."""
    total = 0.0
    for w, count, _ in row:
        if need <= 0:
            break
        take = count if count < need else need
        total += take * w
        need -= take
    return total


def greedy_incumbent(problem: Problem, cap: list[int], k: int,
                      neighbours: list[list[tuple[float, int, int]]]) -> tuple[float, list[int]] | None:
    """(objective, GPUs per class) of the best greedy growth, from no seed and from the
    SEEDS most promising classes, improved by one-GPU moves; None when no k-set fits."""
    m = len(cap)
    root = sorted(range(m), key=lambda d: problem.unary[d] + 0.5 * _partner_sum(neighbours[d], k - 1))
    best: tuple[float, list[int]] | None = None
    for seed in [None, *root[:min(SEEDS, max(1, m // 4))]]:
        found = _grow(problem, cap, k, seed)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    return _improve(problem, cap, k, best) if best is not None else None


def _improve(problem: Problem, cap: list[int], k: int, start: tuple[float, list[int]]) -> tuple[float, list[int]]:
    """Move one GPU between classes while that lowers the objective (first improvement
    is not enough on hierarchical hosts; take the best move each round)."""
    m = len(cap)
    inter, intra, node = problem.inter, problem.intra, problem.node
    objective, counts = start[0], list(start[1])
    h = [problem.unary[c] + sum(inter[c][e] * counts[e] for e in range(m) if e != c) for c in range(m)]
    used: dict[int, int] = {}
    for c in range(m):
        if counts[c]:
            used[node[c]] = used.get(node[c], 0) + counts[c]
    for _ in range(2 * m):
        best_delta, move = -1e-12, None
        for a in range(m):
            if counts[a] <= problem.lo[a]:
                continue
            save = h[a] + intra[a] * (counts[a] - 1)
            row = inter[a]
            va = node[a]
            for b in range(m):
                if b == a or counts[b] >= cap[b]:
                    continue
                delta = h[b] + intra[b] * counts[b] - row[b] - save
                if delta >= best_delta:
                    continue
                vb = node[b]
                if vb != va:
                    have = used.get(vb, 0)
                    if problem.node_cap is not None and have + 1 > problem.node_cap.get(vb, k):
                        continue
                    if (problem.max_nodes is not None and have == 0
                            and len(used) - (1 if used.get(va, 0) == 1 else 0) >= problem.max_nodes):
                        continue
                best_delta, move = delta, (a, b)
        if move is None:
            break
        a, b = move
        objective += best_delta
        for c, step in ((a, -1), (b, 1)):
            counts[c] += step
            used[node[c]] = used.get(node[c], 0) + step
            if used[node[c]] == 0:
                del used[node[c]]
            row = inter[c]
            for e in range(m):
                if e != c:
                    h[e] += row[e] * step
    return objective, counts


def _grow(problem: Problem, cap: list[int], k: int, seed: int | None) -> tuple[float, list[int]] | None:
    """The forced GPUs, the seed's, then the cheapest next GPU until there are k (None
    when the constraints stop it first)."""
    m = len(cap)
    inter, intra, node = problem.inter, problem.intra, problem.node
    counts = [0] * m
    marginal = list(problem.unary)  # cost of one more GPU of class c, intra pairs aside
    used: dict[int, int] = {}
    total, objective = 0, 0.0

    def allowed(c: int, n: int) -> bool:
        if counts[c] + n > cap[c]:
            return False
        v = node[c]
        if problem.node_cap is not None and used.get(v, 0) + n > problem.node_cap.get(v, k):
            return False
        return not (problem.max_nodes is not None and used.get(v, 0) == 0 and len(used) >= problem.max_nodes)

    def add(c: int, n: int) -> None:
        nonlocal total, objective
        objective += n * marginal[c] + intra[c] * (counts[c] * n + n * (n - 1) / 2)
        counts[c] += n
        total += n
        used[node[c]] = used.get(node[c], 0) + n
        row = inter[c]
        for e in range(m):
            if e != c:
                marginal[e] += row[e] * n

    for c in range(m):
        if problem.lo[c]:
            if not allowed(c, problem.lo[c]):
                return None
            add(c, problem.lo[c])
    if seed is not None and total < k and allowed(seed, 1):
        add(seed, 1)
    while total < k:
        pick, low = -1, float("inf")
        for c in range(m):
            value = marginal[c] + intra[c] * counts[c]
            if value < low and allowed(c, 1):
                pick, low = c, value
        if pick < 0:
            return None
        add(pick, 1)
    return objective, counts


def class_order(problem: Problem, cap: list[int], k: int, incumbent: tuple[float, list[int]] | None) -> list[int]:
    """Forced classes first, then the incumbent's (fullest first), then the rest by
    their weight to the incumbent: later depths then hold only poor classes, which makes
    their bounds tight."""
    m = len(cap)
    counts = incumbent[1] if incumbent else [0] * m
    pull = [problem.unary[d] + sum(problem.inter[d][e] * counts[e] for e in range(m) if e != d) for d in range(m)]
    return sorted(range(m), key=lambda d: (problem.lo[d] == 0, counts[d] == 0, -counts[d], pull[d], d))
