"""The search as a decision runs it on a host view: which solver answers (one GPU
directly, the equal-cost sets for the look-ahead to choose among, or the minimum), and
the memo that makes a repeated search a lookup.

Its own module because the memo is a concept of its own: a search is kept per view first
by its arguments, then by the problem's shape (per class: twin, per-GPU term, GPUs free,
GPUs forced), so the same shape over other free twins costs a lookup whose counts are
mapped onto this problem's GPUs. It runs for a grant and for back-pressure (engine) and
for the host's reference sets (topod.alloc.reference).
"""

from __future__ import annotations

from topod.alloc.hostview import DELTA_NODE, best_set_census
from topod.alloc.packing import free_per_twin, look_ahead
from topod.alloc.search import SearchResult, build_problem, solve, solve_one
from topod.alloc.ties import one_ties, solve_ties

DELTA_FRAG = 1e-7  # the weight of packing phi: a tie-break below every cost step (engine's docstring)
# Searches kept per host view, divided by its GPUs (an entry grows with them, and a big
# host repeats a state less often): 2,048 on 8 GPUs, 256 on 64. With the decisions the
# engine keeps (engine.DECISION_MEMO_GPUS), under 1 MiB on 8 GPUs and about 2 MiB on 64
# after bench/alloc.py's stream.
SEARCH_MEMO_GPUS = 16_384


def search_view(view, candidates, must, unary, node_cap, max_nodes, k, budget,
                busy: set[int] | None = None, leases: tuple = ()) -> SearchResult | None:
    """The minimum-objective set; given `busy` (a grant, not a reference), the look-ahead
    chooses among the equal-cost ones, weighing what each of `leases` (engine._lease_shape)
    would give back.

    Memoised per view (SEARCH_MEMO_GPUS / GPUs, oldest out), first by the arguments themselves (the
    same GPUs free with the same terms and caps, whatever CPUs the leases hold), then by
    the problem's shape, not its GPUs:
    per class (static twin, per-GPU term, GPUs free, GPUs forced) in the problem's order,
    the node caps and limits and, for the look-ahead, the free GPUs per twin class and the
    leases' classes. Every
    solver answers with how many GPUs of each class, taken first-listed first, so the
    same shape gets the same counts whichever twins are free: the memo keeps the counts
    and maps them onto this problem's GPUs. engine.prepare fills it for the empty host."""
    census = best_set_census(view) if busy is not None and DELTA_FRAG * k < DELTA_NODE / 2 else None
    if k == 1 and not must:
        if not census:
            return solve_one(candidates, unary, view.node, node_cap)
        ties = one_ties(candidates, view.twin, unary, view.node, node_cap, max_nodes, DELTA_FRAG)
        if ties:
            return look_ahead(view, census, busy, ties, leases)
    memo = view.search_memo
    caps = tuple(sorted(node_cap.items())) if node_cap is not None else None
    # The same GPUs free with the same terms (the CPUs leases hold differ): no problem to build.
    exact_key = ("gpus", k, budget, max_nodes, caps, tuple(candidates), frozenset(must),
                 tuple([unary.get(p, 0.0) for p in candidates]), (frozenset(busy), leases) if census else None)
    known = memo.get(exact_key)
    if known is not None:
        return known or None
    found = _by_shape(view, census, candidates, must, unary, node_cap, max_nodes, caps, k, budget, busy, leases)
    memo[exact_key] = found or False
    if len(memo) > SEARCH_MEMO_GPUS // view.n:
        del memo[next(iter(memo))]
    return found


def _by_shape(view, census, candidates, must, unary, node_cap, max_nodes, caps, k, budget, busy, leases):
    """The search by the problem's shape (see search_view)."""
    problem = build_problem(candidates, must, view.twin, view.node, view.search_weight, unary, node_cap, max_nodes)
    twin = view.twin
    key = (k, budget, max_nodes, caps,
           tuple([(twin[group[0]], u, len(group), lo) for group, u, lo in zip(problem.members, problem.unary,
                                                                                problem.lo)]),
           (tuple(free_per_twin(view, busy)), leases) if census else None)
    memo = view.search_memo
    known = memo.get(key)
    if known is None:
        found = _solve(view, census, problem, k, budget, busy, leases)
        memo[key] = _counts(problem, found) if found is not None else False
        if len(memo) > SEARCH_MEMO_GPUS // view.n:
            del memo[next(iter(memo))]
        return found
    if known is False:
        return None
    counts, objective, exact, visited = known
    members = sorted(p for group, n in zip(problem.members, counts) if n for p in group[:n])
    return SearchResult(tuple(members), objective, exact, visited)


def _counts(problem, found: SearchResult) -> tuple:  # noqa: ANN001 - search.Problem
    """A result as GPUs per class of its problem (what the memo keeps)."""
    where = {p: c for c, group in enumerate(problem.members) for p in group}
    counts = [0] * len(problem.members)
    for p in found.members:
        counts[where[p]] += 1
    return tuple(counts), found.objective, found.exact, found.visited


def _solve(view, census, problem, k, budget, busy, leases) -> SearchResult | None:
    if census:
        # phi < 1 per GPU, so sets within DELTA_FRAG x k differ only in the tie-break term
        ties = solve_ties(problem, k, DELTA_FRAG * k, budget=budget)
        if ties:
            return look_ahead(view, census, busy, ties, leases)
    return solve(problem, k, budget)
