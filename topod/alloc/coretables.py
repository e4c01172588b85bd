"""The CPU tables the engine keeps per host view (in HostView.cache): the core map, the
"auto" fair share, the capacity that gives every GPU its full share, and what "auto"
can give per node now.

Its own module because the tables depend on the host and the reserved CPUs alone, not
on the request: built once per view (engine.prepare builds them ahead) and read by
every decision that wants CPUs. Assigning the CPUs is topod.alloc.cores.
"""

from __future__ import annotations

from topod.alloc.cores import auto_capacity, auto_table, core_map, fair_share, node_capacity
from topod.alloc.hostview import HostView
from topod.alloc.nodecores import CoreMap
from topod.alloc.request import FreeState


def auto_share(view: HostView, cmap: CoreMap, state: FreeState) -> dict[int, int]:
    """The "auto" fair share depends on the host and the reserved CPUs only: kept per view."""
    key = ("fair_share", state.reserved_cpus)
    share = view.cache.get(key)
    if share is None:
        share = view.cache[key] = fair_share(view.topology, set(state.reserved_cpus), cmap)
    return share


def view_core_map(view: HostView) -> CoreMap:
    """The topology's core map, kept per view."""
    cmap = view.cache.get("core_map")
    if cmap is None:
        cmap = view.cache["core_map"] = core_map(view.topology)
    return cmap


def full_shares(view: HostView, cmap: CoreMap, state: FreeState, share: dict[int, int],
                members: tuple[int, ...] | list[int]) -> bool:
    """Whether the empty host's cores give every GPU of the set its full auto share
    (else topod.alloc.nodecores.auto_plan degrades it); per node, kept per view."""
    key = ("full_share_capacity", state.reserved_cpus)
    capacity = view.cache.get(key)
    if capacity is None:
        capacity = view.cache[key] = node_capacity(view.topology, set(state.reserved_cpus), share, cmap)
    counts: dict[int, int] = {}
    for p in members:
        counts[view.node[p]] = counts.get(view.node[p], 0) + 1
    return all(count <= capacity.get(v, 0) for v, count in counts.items())


def auto_cap(view: HostView, cmap: CoreMap, state: FreeState, share: dict[int, int],
             excluded: set[int], now=None) -> dict[int, int]:  # noqa: ANN001 - node_cores' mapping
    key = ("auto_table", state.reserved_cpus)
    table = view.cache.get(key)
    if table is None:
        table = view.cache[key] = auto_table(view.topology, share, set(state.reserved_cpus), view.node_gpus, cmap)
    capacity = auto_capacity(view.topology, table, excluded, cmap, now)
    return {v: capacity.get(v, 0) for v in set(view.node)}
