"""Grading a GPU set (pure): its cost, its satisfaction, the level it reaches and the
performance estimate a decision reports, against the host's best set of its size.
"""

from __future__ import annotations

from topod.alloc.estimate import weakest
from topod.alloc.hostview import DELTA_NODE, HostView
from topod.alloc.request import Performance


def set_cost(view: HostView, members: list[int]) -> float:
    weight = view.weight
    return sum(weight[a][b] for i, a in enumerate(members) for b in members[i + 1:])


def satisfaction(view: HostView, members: list[int]) -> float:
    pairs = [(a, b) for i, a in enumerate(members) for b in members[i + 1:]]
    if not pairs:
        return 1.0
    return sum(1 for a, b in pairs if view.node[a] == view.node[b] and view.node[a] >= 0) / len(pairs)


def level_of(nodes: int, limit: int, cost: float, ref_cost: float, k: int) -> str:
    if nodes > limit:
        return "any"
    # The reference set minimised cost + DELTA_NODE x crossings, so allow that much.
    tolerance = 1e-9 * (1.0 + abs(ref_cost)) + DELTA_NODE * k * (k - 1) / 2
    return "best" if cost <= ref_cost + tolerance else "good"


def decision_summary(k: int, cost: float, ref_cost: float, level: str, nodes: int, limit: int) -> str:
    return (f"{k} GPU(s), cost {cost:.2f} (host best {ref_cost:.2f}), {nodes} NUMA node(s) "
            f"(good allows {limit}): level {level}")


def set_performance(view: HostView, members: list[int], ref_members: tuple[int, ...], limit: int,
                 reasons: list[str]) -> Performance:
    floors = level_floors(view, ref_members, limit)
    unknown = [g for g in view.unknown_link if g in {view.gpus[p].index for p in members}] if view.unknown_link else ()
    if unknown and len(members) > 1:
        reasons.append(f"PCIe link rate of GPU {', '.join(map(str, unknown))} unknown: estimate assumes Gen4 x16")
    pair = weakest(members, view.bandwidth)
    if pair is None:
        return Performance(1.0, None, None, floors)
    rate = view.bandwidth[pair[0]][pair[1]]
    return Performance(min(1.0, rate / reference_rate(view, ref_members)), view.distance[pair[0]][pair[1]].label, rate,
                       floors)


def reference_rate(view: HostView, ref_members: tuple[int, ...]) -> float:
    key = ("ref_rate", ref_members)
    rate = view.cache.get(key)
    if rate is None:
        pair = weakest(list(ref_members), view.bandwidth)
        rate = view.cache[key] = view.bandwidth[pair[0]][pair[1]] if pair else 1.0
    return rate


def level_floors(view: HostView, ref_members: tuple[int, ...], limit: int) -> dict[str, float]:
    key = ("floors", ref_members, limit)
    cached = view.cache.get(key)
    if cached is None:
        ref = reference_rate(view, ref_members)
        lowest = min((view.bandwidth[a][b] for a in range(view.n) for b in range(a + 1, view.n)), default=ref)
        same = min((view.bandwidth[a][b] for a in range(view.n) for b in range(a + 1, view.n)
                    if view.node[a] == view.node[b]), default=ref)
        good = same if limit == 1 else lowest
        cached = {"best": 1.0, "good": min(1.0, good / ref), "any": min(1.0, lowest / ref)}
        view.cache[key] = cached
    return dict(cached)
