"""A host's cores as the CPU rules count them (pure): the CoreMap (what the topology
alone says about them, built by topod.alloc.cores.core_map, with the tables kept on it),
NodeCores (one node's cores in CPU order, the usable ones as bits), its usable cores in
order, how many GPUs they serve at so many CPUs each, the free CPUs a call's picks leave,
and what each GPU of a set gets from them under "auto" on the empty host (auto_plan).

Its own module because these answer about the cores, whoever built them: the
assignment across nodes (topod.alloc.cores) and the pick of one GPU's cores
(topod.alloc.windows) both ask them, and neither imports the other's rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Core = tuple[int, ...]


@dataclass(slots=True)  # built per node per decision: not frozen, whose __init__ is slower
class NodeCores:
    all_cores: list[Core]  # every core of the node in CPU order (defines contiguity)
    free: int  # bit i set: all_cores[i] is usable (eligible, none of its CPUs excluded, leased or reserved)
    llc: dict[Core, int]
    node: int = -1  # the node (the key of the map's window tables)


@dataclass(frozen=True, slots=True)
class CoreMap:
    """What the topology alone says about cores (the engine keeps one per host view):
    node -> cores in CPU order, their LLC, and which could ever be used; per CPU the
    cores it belongs to (so excluded CPUs block their cores without a scan of every
    core); per GPU address its PCIe local CPUs (a device lookup is a scan of the tree).

    Cores are also numbered as bits: within a node by their position in CPU order, and
    across the map by `offset[node]` + that position (one int holds the cores a set of
    CPUs blocks on every node)."""

    nodes: dict[int, tuple[list[Core], dict[Core, int], frozenset[Core]]]
    core_of: dict[int, tuple[tuple[int, Core], ...]] = field(default_factory=dict)
    local: dict[str, frozenset[int]] = field(default_factory=dict)
    whole: dict[int, NodeCores] = field(default_factory=dict)  # node_cores of a node nothing excludes from
    capacity_memo: dict = field(default_factory=dict)  # auto_capacity per node, by its plans and free cores
    cpu_bits: dict[int, int] = field(default_factory=dict)  # CPU -> its cores' bits, across the map
    offset: dict[int, int] = field(default_factory=dict)  # node -> its first bit across the map
    eligible: dict[int, int] = field(default_factory=dict)  # node -> its eligible cores as bits
    marks: dict[Core, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # core -> (node, its bit) per node
    windows: dict = field(default_factory=dict)  # (node, CPUs, local CPUs) -> pick_cores's windows, best first
    blocked_memo: dict = field(default_factory=dict)  # node_cores by the bits its excluded CPUs block


def usable_cores(cores: NodeCores | None) -> list[Core]:
    """The node's usable cores in CPU order (none for a node not there)."""
    if not cores:
        return []
    free = cores.free
    return [core for i, core in enumerate(cores.all_cores) if free >> i & 1]


def auto_plan(counts: Mapping[int | None, int], share: Mapping[int, int],
              empty: Mapping[int, NodeCores]) -> dict[int | None, int | None]:
    """node -> CPUs per GPU for `counts[node]` GPUs of one set under auto, judged on the
    empty host (`empty`: node_cores with only reserved CPUs out): the fair share when the
    node's usable cores hold that many shares, else as many whole cores each as they
    hold (> 0, fewer than the share); 0 when there are fewer usable cores than GPUs (the
    GPUs share them); None when the node has no usable core (the nearest node's)."""
    plan: dict[int | None, int | None] = {}
    for node, m in counts.items():
        cores = empty.get(node) if node is not None else None
        usable = usable_cores(cores)
        if not usable:
            plan[node] = None
            continue
        each = len(usable) // m
        if each == 0:
            plan[node] = 0
            continue
        fit = each * min(len(core) for core in usable)
        full = share.get(node, 0) if node is not None else 0
        plan[node] = full if full and gpus_served(usable, full) >= m else min(full, fit) if full else fit
    return plan


def gpus_served(cores: list[Core], wanted: int) -> int:
    """How many GPUs `cores` (in node order) serve at `wanted` CPUs each, whole cores."""
    served = have = 0
    for core in cores:
        have += len(core)
        if have >= wanted:
            served, have = served + 1, 0
    return served


def free_cpus(cores: NodeCores | None, taken: Mapping[int, int]) -> int:
    if cores is None:
        return 0
    free = cores.free & ~taken.get(cores.node, 0)
    return sum(len(core) for i, core in enumerate(cores.all_cores) if free >> i & 1)
