"""Minimum-cost GPU set search: exact branch and bound for small candidate pools,
seeded greedy with swap refinement beyond (near-exact, milliseconds at 64 GPUs).

Cost of a set = sum of pairwise weights. Ties break on `secondary` (lower first), which
the engine uses to keep the remaining free GPUs well connected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

EXACT_LIMIT = 16
EPSILON = 1e-9


def set_cost(members: Sequence[int], weight: list[list[float]]) -> float:
    return sum(weight[a][b] for i, a in enumerate(members) for b in members[i + 1:])


def best_set(
    pool: Sequence[int],
    size: int,
    weight: list[list[float]],
    secondary: Callable[[Sequence[int]], float],
    required: Sequence[int] = (),
    allowed: Callable[[Sequence[int]], bool] | None = None,
) -> tuple[tuple[int, ...], float] | None:
    """The cheapest `size`-set of `pool` (matrix indices) containing `required` for which
    `allowed` holds; None when there is none."""
    optional = [p for p in pool if p not in required]
    if len(required) + len(optional) < size:
        return None
    if len(optional) <= EXACT_LIMIT:
        return _branch_and_bound(list(required), optional, size, weight, secondary, allowed)
    return _greedy_swap(list(required), optional, size, weight, secondary, allowed)


def _branch_and_bound(required, optional, size, weight, secondary, allowed):
    best: list = [None, float("inf"), float("inf")]
    need = size - len(required)
    base = set_cost(required, weight)
    inc0 = [sum(weight[x][r] for r in required) for x in optional]
    min_pair = min((weight[a][b] for i, a in enumerate(optional) for b in optional[i + 1:]), default=0.0)

    def visit(start: int, chosen: list[int], cost: float, inc: list[float]) -> None:
        left = need - len(chosen)
        if left == 0:
            members = required + chosen
            if allowed is not None and not allowed(members):
                return
            if cost < best[1] - EPSILON or (abs(cost - best[1]) <= EPSILON and secondary(members) < best[2]):
                best[0], best[1], best[2] = tuple(members), cost, secondary(members)
            return
        remaining = range(start, len(optional))
        if len(remaining) < left:
            return
        bound = cost + sum(sorted(inc[i] for i in remaining)[:left]) + min_pair * left * (left - 1) / 2
        if bound > best[1] + EPSILON:
            return
        for i in remaining:
            x = optional[i]
            new_inc = [inc[j] + weight[x][optional[j]] for j in range(len(optional))]
            chosen.append(x)
            visit(i + 1, chosen, cost + inc[i], new_inc)
            chosen.pop()

    visit(0, [], base, inc0)
    return (best[0], best[1]) if best[0] is not None else None


def _greedy_swap(required, optional, size, weight, secondary, allowed):
    seeds = optional if not required else [None]
    candidates = []
    for seed in _spread(seeds, 16):
        chosen = list(required) + ([seed] if seed is not None else [])
        rest = [x for x in optional if x not in chosen]
        inc = {x: sum(weight[x][c] for c in chosen) for x in rest}
        while len(chosen) < size and rest:
            x = min(rest, key=lambda y: (inc[y], y))
            chosen.append(x)
            rest.remove(x)
            for y in rest:
                inc[y] += weight[y][x]
        if len(chosen) == size:
            candidates.append(_improve(chosen, required, optional, weight))
    scored = []
    for members in candidates:
        if allowed is not None and not allowed(members):
            continue
        scored.append((round(set_cost(members, weight), 9), secondary(members), tuple(members)))
    if not scored:
        return None
    cost, _, members = min(scored)
    return members, cost


def _spread(items, limit):
    if len(items) <= limit:
        return list(items)
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def _improve(chosen, required, optional, weight):
    members = list(chosen)
    improved = True
    while improved:
        improved = False
        for i, out in enumerate(members):
            if out in required:
                continue
            others = members[:i] + members[i + 1:]
            current = sum(weight[out][o] for o in others)
            for candidate in optional:
                if candidate in members:
                    continue
                if sum(weight[candidate][o] for o in others) < current - EPSILON:
                    members[i] = candidate
                    improved = True
                    break
            if improved:
                break
    return members
