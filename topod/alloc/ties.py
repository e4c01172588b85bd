"""The GPU sets within a slack of the minimum objective, lowest first: solve_ties over a
search Problem, one_ties for one GPU without building one.

Its own module because it answers another question than topod.alloc.search (every
near-minimum set, not the minimum), for a caller that chooses among equal-cost sets by
something no sum of pair and per-GPU terms expresses (the engine's look-ahead,
topod.alloc.packing: what the leftover GPUs can serve). It runs the search's branch and
bound with the pruning loosened by the slack; one and two GPUs are answered without a
search, and a set confined to one node by each node's own, smaller search.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter

from topod.alloc.search import (NODE_BUDGET, Problem, SearchResult, branch_and_bound, chosen_positions,
                                class_neighbours, class_order, greedy_incumbent, node_room, objective_eps, only_set,
                                single_ties, solve)

_OBJECTIVE = attrgetter("objective")
_MEMBERS = attrgetter("members")
_FIRST = itemgetter(0)
_SECOND = itemgetter(1)

TIE_LIMIT = 64  # more near-equal sets than this: the caller keeps solve's choice


def solve_ties(problem: Problem, k: int, slack: float, limit: int = TIE_LIMIT,
               budget: int = NODE_BUDGET) -> list[SearchResult] | None:
    """Every set whose objective is within `slack` of the minimum, lowest first; None when
    there are more than `limit` of them, the budget runs out or no set exists."""
    cap = [len(group) for group in problem.members]
    if sum(cap) < k or sum(problem.lo) > k or k <= 0 or node_room(problem, cap, k) < k:
        return None
    if sum(cap) == k:
        only = only_set(problem, cap, k)
        return [only] if only else None
    if k == 1 and not any(problem.lo):
        found = single_ties(problem, slack)
    elif k == 2:
        found = _pair_ties(problem, cap, slack)
    elif problem.max_nodes == 1 and len(set(problem.node)) > 1:
        return _ties_per_node(problem, k, slack, limit, budget)
    else:
        neighbours = class_neighbours(problem, cap)
        incumbent = greedy_incumbent(problem, cap, k, neighbours)
        order = class_order(problem, cap, k, incumbent)
        kept: list[tuple[float, list[int]]] = []
        best = branch_and_bound(problem, cap, k, order, incumbent, budget, neighbours, (kept, slack, limit))
        if best is None or not best.exact:
            return None
        found = [SearchResult(chosen_positions(problem, order, counts), objective, True, best.visited)
                 for objective, counts in kept if objective <= best.objective + slack]
    found = _in_order(found)
    return found if 0 < len(found) <= limit else None


def _in_order(found: list[SearchResult]) -> list[SearchResult]:
    """Lowest objective first; objectives equal but for rounding (one set summed in
    another order) count as equal, and the lower positions come first among them, so
    the order does not depend on how a search added the terms up."""
    if len(found) < 2:
        return list(found)
    found = sorted(found, key=_OBJECTIVE)
    out: list[SearchResult] = []
    start = 0
    for i in range(1, len(found) + 1):
        if i == len(found) or found[i].objective > found[start].objective + objective_eps(found[start].objective):
            out.extend(sorted(found[start:i], key=_MEMBERS) if i - start > 1 else found[start:i])
            start = i
    return out


def _singles_in_order(found: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """_in_order for one-GPU sets given as (objective, position): the same order."""
    if len(found) < 2:
        return found
    found = sorted(found, key=_FIRST)
    out: list[tuple[float, int]] = []
    start = 0
    for i in range(1, len(found) + 1):
        if i == len(found) or found[i][0] > found[start][0] + objective_eps(found[start][0]):
            out.extend(sorted(found[start:i], key=_SECOND) if i - start > 1 else found[start:i])
            start = i
    return out


def _ties_per_node(problem: Problem, k: int, slack: float, limit: int, budget: int) -> list[SearchResult] | None:
    """solve_ties when the set must lie on one node: each node's classes alone (a much
    smaller search, or the node's only set when it has exactly k free), then the sets
    within slack of the least of them, lowest first, as the whole search gives them."""
    found: list[SearchResult] = []
    crowded: list[float] = []  # the minimum of a node with more than `limit` near-equal sets
    members, node, lo, node_cap = problem.members, problem.node, problem.lo, problem.node_cap
    by_node: dict[int, list[int]] = {}  # node -> its classes, nodes in first-listed order
    for c, v in enumerate(node):
        by_node.setdefault(v, []).append(c)
    forced = {node[c] for c in range(len(members)) if lo[c]}
    for v, on in by_node.items():
        size = sum(len(members[c]) for c in on)
        if size < k or (node_cap is not None and node_cap.get(v, k) < k):
            continue  # this node cannot hold the set: no sub-search to prove it
        if forced and (len(forced) > 1 or v not in forced):
            continue  # a forced GPU lies elsewhere
        if size == k and k > 0:  # the node's only set (what solve_ties of its classes gives)
            found.append(_whole_node(problem, on))
            continue
        sub = Problem(members=[problem.members[c] for c in on], lo=[problem.lo[c] for c in on],
                      unary=[problem.unary[c] for c in on], intra=[problem.intra[c] for c in on],
                      inter=[[problem.inter[a][b] for b in on] for a in on], node=[v] * len(on),
                      node_cap=problem.node_cap, max_nodes=1)
        ties = solve_ties(sub, k, slack, limit, budget)
        if ties is not None:
            found.extend(ties)
            continue
        least = solve(sub, k, budget)
        if least is not None:  # a set exists, but too many tie or the budget ran out
            if not least.exact:
                return None
            crowded.append(least.objective)
    if not found and not crowded:
        return None
    low = min([result.objective for result in found] + crowded)
    if any(objective <= low + slack for objective in crowded):
        return None
    found = _in_order([result for result in found if result.objective <= low + slack])
    return found if 0 < len(found) <= limit else None


def _whole_node(problem: Problem, on: list[int]) -> SearchResult:
    """only_set of the classes `on` alone (one node's, k GPUs in all): the same sums
    in the same order, without building their sub-problem."""
    unary, intra, inter, members = problem.unary, problem.intra, problem.inter, problem.members
    cap = [len(members[c]) for c in on]
    m = len(on)
    objective = sum(unary[c] * n + intra[c] * n * (n - 1) / 2 for c, n in zip(on, cap))
    objective += sum(inter[on[a]][on[b]] * cap[a] * cap[b] for a in range(m) for b in range(a + 1, m))
    return SearchResult(tuple(sorted(p for c in on for p in members[c])), objective, True, 1)


def one_ties(candidates: list[int], twin: list[int], unary: dict[int, float], node: list[int],
             node_cap: dict[int, int] | None, max_nodes: int | None, slack: float,
             limit: int = TIE_LIMIT) -> list[SearchResult] | None:
    """solve_ties(build_problem(candidates, set(), twin, node, w, unary, node_cap,
    max_nodes), 1, slack) without building the class matrix: one GPU, nothing forced,
    so only the per-GPU terms and the node caps matter. Per class (twin, term) its first
    GPU; the open ones within slack of the cheapest, in order; None as solve_ties."""
    if max_nodes is not None and max_nodes < 1:
        return None
    first: dict[tuple, tuple[int, float]] = {}  # class -> (its first GPU, its term)
    get = unary.get
    for p in candidates:
        u = get(p, 0.0)
        key = (twin[p], round(u, 12))
        seen = first.get(key)
        if seen is None or p < seen[0]:
            first[key] = (p, u)
    open_ = [(u, p) for p, u in first.values() if node_cap is None or node_cap.get(node[p], 1) >= 1]
    if not open_:
        return None
    low = min(open_)[0]
    near = [item for item in open_ if item[0] <= low + slack]
    if len(near) > limit:
        return None
    return [SearchResult((p,), u, True, 1) for u, p in _singles_in_order(near)]


def _pair_ties(problem: Problem, cap: list[int], slack: float) -> list[SearchResult]:
    """Two GPUs: every class pair directly (cheaper than a search with loosened bounds);
    what search._fits_nodes and the forced counts allow, checked inline (the commonest search)."""
    lo, node, node_cap, max_nodes = problem.lo, problem.node, problem.node_cap, problem.max_nodes
    unary, intra, members = problem.unary, problem.intra, problem.members
    forced = sum(lo)
    pairs: list[tuple[float, int, int]] = []
    room = [node_cap.get(v, 2) for v in node] if node_cap is not None else None  # per class, its node's cap
    together = max_nodes is None or max_nodes >= 1
    apart = max_nodes is None or max_nodes >= 2  # two nodes allowed
    for a in range(len(cap)):
        ua, la, va, row = unary[a], lo[a], node[a], problem.inter[a]
        ra = room[a] if room is not None else 2
        if cap[a] >= 2 and forced <= la <= 2 and together and ra >= 2:
            pairs.append((ua + ua + intra[a], a, a))
        if la > 1:
            continue
        for b in range(a + 1, len(cap)):
            lb = lo[b]
            if lb > 1 or la + lb < forced:
                continue
            if node[b] == va:
                if ra < 2:
                    continue
            elif not apart or ra < 1 or (room is not None and room[b] < 1):
                continue
            pairs.append((ua + unary[b] + row[b], a, b))
    low = min((objective for objective, _, _ in pairs), default=0.0)
    out = []
    for objective, a, b in pairs:
        if objective <= low + slack:
            p, q = members[a][:2] if a == b else (members[a][0], members[b][0])
            out.append(SearchResult((p, q) if p < q else (q, p), objective, True, 1))
    return out
