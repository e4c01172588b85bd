"""The host's reference for a request size, what the levels are judged against: the
fewest NUMA nodes a k-set can span on the empty host (good_node_limit, level good) and
the cheapest set within them (reference_set, level best).

Its own module because a reference belongs to the host, not to a decision: computed once
per size and filter and kept per host view (engine.prepare computes the unfiltered ones
ahead), then read by every decision of that size.
"""

from __future__ import annotations

from topod.alloc.grading import set_cost
from topod.alloc.hostview import HostView
from topod.alloc.viewsearch import search_view


def good_node_limit(view: HostView, k: int, eligible: list[int], must: set[int]) -> int:
    """The fewest NUMA nodes a k-set can span on the empty host (see 'good')."""
    key = ("node_limit", k) if not must and len(eligible) == view.n else None
    if key is not None and key in view.cache:
        return view.cache[key]
    limit = _node_limit(view, k, eligible, must)
    if key is not None:
        view.cache[key] = limit
    return limit


def _node_limit(view: HostView, k: int, eligible: list[int], must: set[int]) -> int:
    per_node: dict[int, int] = {}
    for p in eligible:
        per_node[view.node[p]] = per_node.get(view.node[p], 0) + 1
    forced = {view.node[p] for p in must}
    total = sum(per_node[v] for v in forced)
    count = len(forced)
    for size in sorted((c for v, c in per_node.items() if v not in forced), reverse=True):
        if total >= k:
            break
        total += size
        count += 1
    return max(count, 1)


def reference_set(view: HostView, k: int, eligible: list[int], must: set[int], limit: int,
                  budget: int) -> tuple[float, tuple[int, ...]]:
    key = ("ref", k, None if len(eligible) == view.n else tuple(eligible), tuple(sorted(must)))
    cached = view.cache.get(key)
    if cached is None:
        found = search_view(view, eligible, must, {}, None, limit, k, budget)
        members = found.members if found else ()
        cached = (set_cost(view, list(members)) if found else float("inf"), members)
        if len(view.cache) > 4096:
            view.cache.clear()
        view.cache[key] = cached
    return cached
