"""Which cores one GPU gets on one node (pure): the best contiguous window of free
cores, else the node's free cores fullest L3 first.

A window is consecutive cores of the node holding the GPU's CPUs; windows are tried
best first: one L3 before several, inside the GPU's PCIe local CPUs before not, then by
start. A node's windows depend on the topology alone, so their table is kept on the
core map (CoreMap.windows), and a pick is a scan of it for the first window wholly free.

Its own module because choosing within one node is apart from the rules across nodes
and GPUs (topod.alloc.cores: which node, the nearest-node fallback, the reasons).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topod.alloc.nodecores import Core, CoreMap, NodeCores

WINDOW_TABLES = 1_024  # _windows per core map (by node, CPUs per GPU and the GPU's local CPUs)
NOWHERE: frozenset[int] = frozenset()  # no local CPUs: no preference

Window = tuple[int, tuple[int, ...], tuple[tuple[int, int], ...]]  # cores as bits, CPUs, (node, bits) to mark taken


def pick_cores(cmap: CoreMap, cores: NodeCores | None, taken: Mapping[int, int], need: int, local: frozenset[int],
               reasons: list[str], gpu: int) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | None:
    """(the CPUs, sorted; per node the cores they take, as bits) or None: the best
    contiguous window of free cores (_windows: single L3, then inside `local`, then
    first), else free cores fullest L3 first (said in `reasons`)."""
    if cores is None:
        return None
    free = cores.free & ~taken.get(cores.node, 0)
    key = (cores.node, need, local)
    table = cmap.windows.get(key)
    if table is None:
        if len(cmap.windows) >= WINDOW_TABLES:
            cmap.windows.clear()
        table = cmap.windows[key] = _windows(cmap, cores, need, local)
    for bits, cpus, marks in table:
        if free & bits == bits:
            return cpus, marks
    ordered = cores.all_cores
    spare = [core for i, core in enumerate(ordered) if free >> i & 1]
    if sum(len(core) for core in spare) < need:
        return None
    # No contiguous window: the fullest L3 domains first, cores in order.
    per_llc: dict[int, int] = {}
    for core in spare:
        per_llc[cores.llc[core]] = per_llc.get(cores.llc[core], 0) + len(core)
    spare.sort(key=lambda core: (-per_llc[cores.llc[core]], cores.llc[core], core))
    picked, have = [], 0
    for core in spare:
        picked.append(core)
        have += len(core)
        if have >= need:
            break
    reasons.append(f"GPU {gpu}: no {need} contiguous free CPUs on its node; cores are not contiguous")
    return tuple(sorted([c for core in picked for c in core])), _marks(cmap, picked)


def _windows(cmap: CoreMap, cores: NodeCores, need: int, local: frozenset[int]) -> tuple[Window, ...]:
    """Every window of consecutive cores of the node from which a GPU could get `need`
    CPUs (from each start, the fewest cores that hold them), best first: single L3
    before several, inside `local` (the GPU's PCIe local CPUs; no preference when
    empty) before not, then by start. pick_cores takes the first one wholly free: the
    window a scan of the free cores in order, keeping the best score, finds. Kept per
    map by (node, need, local): the topology alone decides them."""
    ordered, llc = cores.all_cores, cores.llc
    n = len(ordered)
    scored = []
    for start in range(n):
        have, end = 0, start
        while end < n:  # need >= 1: callers ask for at least one CPU
            have += len(ordered[end])
            end += 1
            if have >= need:
                break
        if have < need:
            break  # a later start has fewer cores after it
        window = ordered[start:end]
        outside = bool(local) and any(c not in local for core in window for c in core)
        scored.append(((len({llc[core] for core in window}) > 1, outside, start), window))
    scored.sort(key=lambda item: item[0])
    return tuple((sum(1 << i for i in range(score[2], score[2] + len(window))),
                  tuple(sorted([c for core in window for c in core])), _marks(cmap, window))
                 for score, window in scored)


def _marks(cmap: CoreMap, picked: list[Core]) -> tuple[tuple[int, int], ...]:
    """Per node, the picked cores as its bits (a core listed on two nodes is taken on both)."""
    out: dict[int, int] = {}
    for core in picked:
        for node, bit in cmap.marks.get(core, ()):
            out[node] = out.get(node, 0) | bit
    return tuple(out.items())
