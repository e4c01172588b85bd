"""Exact minimum-objective GPU set: branch and bound over twin-class counts.

Objective of a set S: sum of pairwise weights w(a, b) over pairs in S plus a per-GPU
term u(a) (packing, back-pressure). GPUs that are twins (same weight to everyone else,
same u, same node) are interchangeable, so the search chooses how MANY of each class to
take, not which: an 8-GPU NVSwitch node is one class, a PCIe switch with four GPUs is
one class, and a 64-GPU host of such switches is a 16-class problem.

Depth-first over classes in a fixed order, largest count first. Lower bound at depth t
with r GPUs still to choose: every remaining GPU x of class d costs at least
  g(d) + u(d) + 1/2 * (sum of the r-1 cheapest weights from x to the classes >= t)
where g(d) is its exact weight to what is already chosen (each remaining pair is
counted from both ends, hence 1/2). The r cheapest such values, respecting class sizes,
bound the rest. The incumbent comes from greedy growth out of the most promising seeds
(greedy_incumbent, below), and the class order follows it, so the first leaf is usually
optimal and the rest is proof. Constraints: at most `max_nodes` NUMA nodes, at most
`node_cap[v]` GPUs on node v (CPU capacity), at least `lo[c]` of class c (must_include).
A node budget bounds the work; past it the best set found is returned with exact=False.

The sets within a slack of the minimum (solve_ties, one_ties) are topod.alloc.ties: the
same search with the pruning loosened, for callers that choose among equal-cost sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

from topod.alloc.slotinit import slot_init, slot_setters

NODE_BUDGET = 200_000
SEEDS = 4  # single-class seeds tried for the incumbent besides none (at most a quarter of the classes)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__
class Problem:
    members: list[list[int]]  # class -> positions (must_include ones first)
    lo: list[int]  # class -> GPUs it must give
    unary: list[float]
    intra: list[float]  # weight between two GPUs of one class
    inter: list[list[float]]  # class x class weight
    node: list[int]
    node_cap: dict[int, int] | None = None
    max_nodes: int | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    members: tuple[int, ...]  # positions
    objective: float
    exact: bool
    visited: int


_SEARCH_RESULT = slot_setters(SearchResult)


def _search_result_init(self, members, objective, exact, visited) -> None:  # noqa: ANN001 - see slot_init
    set_members, set_objective, set_exact, set_visited = _SEARCH_RESULT
    set_members(self, members)
    set_objective(self, objective)
    set_exact(self, exact)
    set_visited(self, visited)


slot_init(SearchResult, _search_result_init)


class _Budget(Exception):
    pass


def build_problem(candidates: list[int], must: set[int], twin: list[int], node: list[int],
                  weight: list[list[float]], unary: dict[int, float] | None = None,
                  node_cap: dict[int, int] | None = None, max_nodes: int | None = None) -> Problem:
    """Classes from static twins, split further by unary value (twins with different
    u are not interchangeable)."""
    unary = unary or {}
    keyed: dict[tuple, list[int]] = {}
    get = unary.get
    for position in candidates:
        key = (twin[position], round(get(position, 0.0), 12))
        group = keyed.get(key)
        if group is None:
            keyed[key] = [position]
        else:
            group.append(position)
    if must:
        members = [sorted(group, key=lambda p: (p not in must, p)) for group in keyed.values()]
        lo = [sum(1 for p in group if p in must) for group in members]
    else:
        members = [sorted(group) for group in keyed.values()]
        lo = [0] * len(members)
    reps = [group[0] for group in members]
    if len(reps) > 1:
        pick = itemgetter(*reps)
        inter = [list(pick(weight[a])) for a in reps]
    else:
        inter = [[weight[a][a]] for a in reps]
    return Problem(
        members=members,
        lo=lo,
        unary=[get(rep, 0.0) for rep in reps],
        intra=[weight[group[0]][group[1]] if len(group) > 1 else 0.0 for group in members],
        inter=inter,
        node=[node[rep] for rep in reps],
        node_cap=node_cap,
        max_nodes=max_nodes,
    )


def solve(problem: Problem, k: int, budget: int = NODE_BUDGET) -> SearchResult | None:
    """The minimum-objective k-set meeting the constraints; None when none exists."""
    cap = [len(group) for group in problem.members]
    if sum(cap) < k or sum(problem.lo) > k or k <= 0 or node_room(problem, cap, k) < k:
        return None
    if k == 1 and not any(problem.lo):
        return _single(problem)
    if sum(cap) == k:
        return only_set(problem, cap, k)
    neighbours = class_neighbours(problem, cap)
    incumbent = greedy_incumbent(problem, cap, k, neighbours)
    order = class_order(problem, cap, k, incumbent)
    return branch_and_bound(problem, cap, k, order, incumbent, budget, neighbours)


def node_room(problem: Problem, cap: list[int], k: int) -> int:
    """At most how many GPUs the node constraints let a set hold (the max_nodes fullest
    nodes, each up to its cap): a search that cannot reach k is not run, since the bound
    ignores node caps and would prove it only by exhausting the tree."""
    node_cap, max_nodes = problem.node_cap, problem.max_nodes
    if node_cap is None and max_nodes is None:
        return k
    per_node: dict[int, int] = {}
    for v, count in zip(problem.node, cap):
        per_node[v] = per_node.get(v, 0) + count
    sizes = (per_node.values() if node_cap is None
             else [min(count, node_cap.get(v, k)) for v, count in per_node.items()])
    if max_nodes is None:
        return sum(sizes)
    if max_nodes == 1:  # the commonest limit: the fullest node
        return max(sizes, default=0)
    return sum(sorted(sizes, reverse=True)[:max_nodes])


def solve_one(candidates: list[int], unary: dict[int, float], node: list[int],
              node_cap: dict[int, int] | None = None) -> SearchResult | None:
    """One GPU and nothing forced: the cheapest per-GPU term among the candidates whose
    node has room, the lowest position on a tie; what solve(build_problem(...), 1) finds,
    without building the class matrix (the API's commonest request, on every host size)."""
    best, pick = float("inf"), -1
    for p in candidates:
        if node_cap is not None and node_cap.get(node[p], 1) < 1:
            continue
        u = unary.get(p, 0.0)
        if u < best:
            best, pick = u, p
    if pick < 0:
        return None
    return SearchResult((pick,), best, True, 1)


def _fits_nodes(problem: Problem, take: dict[int, int], k: int) -> bool:
    """Taking take[c] GPUs of each class c stays within max_nodes and every node's cap."""
    per_node: dict[int, int] = {}
    for c, n in take.items():
        per_node[problem.node[c]] = per_node.get(problem.node[c], 0) + n
    if problem.max_nodes is not None and len(per_node) > problem.max_nodes:
        return False
    return problem.node_cap is None or all(n <= problem.node_cap.get(v, k) for v, n in per_node.items())


def only_set(problem: Problem, cap: list[int], k: int) -> SearchResult | None:
    """Exactly k candidates: the only set, if it meets the constraints."""
    if not _fits_nodes(problem, dict(enumerate(cap)), k):
        return None
    m = len(cap)
    objective = sum(problem.unary[c] * cap[c] + problem.intra[c] * cap[c] * (cap[c] - 1) / 2 for c in range(m))
    objective += sum(problem.inter[a][b] * cap[a] * cap[b] for a in range(m) for b in range(a + 1, m))
    members = tuple(sorted(p for group in problem.members for p in group))
    return SearchResult(members, objective, True, 1)


def _single(problem: Problem) -> SearchResult | None:
    """One GPU: no pairs, so the cheapest per-GPU term wins (exact, no search); the first
    class on a tie."""
    cheapest = single_ties(problem, 0.0)
    return cheapest[0] if cheapest else None


def single_ties(problem: Problem, slack: float) -> list[SearchResult]:
    """One GPU per class whose node has room, within slack of the cheapest, in class order."""
    node_cap, node = problem.node_cap, problem.node
    if problem.max_nodes is not None and problem.max_nodes < 1:
        open_ = []
    else:  # _fits_nodes for one GPU of class c, inline
        open_ = [c for c in range(len(problem.members)) if node_cap is None or node_cap.get(node[c], 1) >= 1]
    low = min((problem.unary[c] for c in open_), default=0.0)
    return [SearchResult((problem.members[c][0],), problem.unary[c], True, 1)
            for c in open_ if problem.unary[c] <= low + slack]


# ---- the incumbent: the branch and bound's starting point -------------------------------
# A good k-set found fast, whose objective prunes the search from its first node and whose
# classes order it. Greedy growth, from no seed and from the most promising single classes
# (each class's own term plus half its cheapest partners), then one-GPU moves between classes
# while the best move lowers the objective. The same constraints as the search: class sizes,
# must-include minimums, per-node capacity and the node limit.


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


# ---- the branch and bound -------------------------------------------------------------


def branch_and_bound(problem: Problem, cap: list[int], k: int, order: list[int],
                     incumbent: tuple[float, list[int]] | None, budget: int,
                     neighbours: list[list[tuple[float, int, int]]],
                     ties: tuple[list[tuple[float, list[int]]], float, int] | None = None) -> SearchResult | None:
    """The minimum; with ties = (kept, slack, limit) it also appends to `kept` every leaf
    within slack of the best so far (prunes only beyond best + slack; past `limit` live
    entries it stops as if the budget ran out)."""
    m = len(order)
    rank = [0] * m
    for position, c in enumerate(order):
        rank[c] = position
    # Everything below is indexed by depth (position in `order`).
    cap_o = [cap[c] for c in order]
    lo_o = [problem.lo[c] for c in order]
    u_o = [problem.unary[c] for c in order]
    intra_o = [problem.intra[c] for c in order]
    node_o = [problem.node[c] for c in order]
    inter_o = [[problem.inter[a][b] for b in order] for a in order]
    rows_o = [[(w, count, rank[e]) for w, count, e in neighbours[c]] for c in order]
    suffix = [0] * (m + 1)
    for t in range(m - 1, -1, -1):
        suffix[t] = suffix[t + 1] + cap_o[t]
    node_cap, max_nodes = problem.node_cap, problem.max_nodes
    # prefix[t][d][j] = 1/2 x the j cheapest partner weights of a class-d GPU among depths >= t
    prefix: list[list[list[float] | None]] = [[None] * m for _ in range(m)]

    def partners(t: int, d: int) -> list[float]:
        out = [0.0]
        total = 0.0
        for w, count, e in rows_o[d]:
            if e < t:
                continue
            for _ in range(min(count, k - len(out))):
                total += 0.5 * w
                out.append(total)
            if len(out) >= k:
                break
        prefix[t][d] = out
        return out

    best = incumbent[0] if incumbent else float("inf")
    best_counts = [incumbent[1][c] for c in order] if incumbent else None
    counts = [0] * m
    g = [0.0] * m
    used: dict[int, int] = {}
    visited = 0
    kept, slack, limit = ties if ties is not None else (None, 0.0, 0)

    def bound(t: int, r: int, current: float) -> float:
        values = []
        row = prefix[t]
        for d in range(t, m):
            sums = row[d] or partners(t, d)
            half = sums[r - 1] if r - 1 < len(sums) else sums[-1]
            values.append((g[d] + u_o[d] + half, cap_o[d]))
        values.sort()
        total, need = current, r
        for value, count in values:
            take = count if count < need else need
            total += take * value
            need -= take
            if need == 0:
                break
        return total

    def dfs(t: int, r: int, current: float) -> None:
        nonlocal best, best_counts, visited
        visited += 1
        if visited > budget:
            raise _Budget
        if r == 0:
            if kept is not None and current <= best + slack:
                _keep(kept, current, counts[:], min(best, current) + slack, limit)
            if current < best - objective_eps(best):
                best, best_counts = current, counts[:]
            return
        if t == m or suffix[t] < r:
            return
        if bound(t, r, current) >= best - objective_eps(best) + slack:
            return
        high = min(cap_o[t], r)
        low = max(lo_o[t], r - suffix[t + 1])
        v = node_o[t]
        row = inter_o[t]
        for n in range(high, low - 1, -1):
            if n > 0:
                have = used.get(v, 0)
                if node_cap is not None and have + n > node_cap.get(v, k):
                    continue
                if max_nodes is not None and have == 0 and len(used) >= max_nodes:
                    continue
                used[v] = have + n
                for d in range(t + 1, m):
                    g[d] += row[d] * n
            counts[t] = n
            dfs(t + 1, r - n, current + n * (g[t] + u_o[t]) + intra_o[t] * n * (n - 1) / 2)
            if n > 0:
                for d in range(t + 1, m):
                    g[d] -= row[d] * n
                if used[v] == n:
                    del used[v]
                else:
                    used[v] -= n
        counts[t] = 0

    exact = True
    try:
        dfs(0, k, 0.0)
    except _Budget:
        exact = False
    if best_counts is None:
        return None
    return SearchResult(chosen_positions(problem, order, best_counts), best, exact, visited)


def _keep(kept: list[tuple[float, list[int]]], objective: float, counts: list[int], cutoff: float,
          limit: int) -> None:
    kept.append((objective, counts))
    if len(kept) > 2 * limit:
        kept[:] = [entry for entry in kept if entry[0] <= cutoff]
        if len(kept) > limit:
            raise _Budget


def chosen_positions(problem: Problem, order: list[int], counts: list[int]) -> tuple[int, ...]:
    """Depth-ordered class counts -> positions (must_include members first in each class)."""
    chosen: list[int] = []
    for depth, n in enumerate(counts):
        chosen.extend(problem.members[order[depth]][:n])
    return tuple(sorted(chosen))


def objective_eps(best: float) -> float:
    return 1e-10 + 1e-13 * abs(best) if best != float("inf") else 0.0
