"""A lease without GPUs (pure): Request(gpus=0, cpus=N, near=...) -> Decision.

Rules (docs/api.md, "Leases without GPUs", says the same):
- `cpus` counts logical CPUs and is rounded up to whole physical cores: every online
  hyper-thread of a core goes with it, so a core is never split between two leases (3
  CPUs on a two-thread host are 2 cores, 4 CPUs; the decision says so).
- The CPUs come from one pool with the GPU leases' (FreeState.busy_cpus): a core any
  lease holds a CPU of is not free, nor one with an isolated, nohz_full, offline or
  reserved (housekeeping, [alloc] reserved_cpus) CPU.
- `near` (a device name, a PCI address or node:N; topod.alloc.near) picks the home node:
  the device's NUMA node. Within it, a contiguous window of cores in one L3, inside the
  device's PCIe local CPUs where it can, as a GPU's cores are picked (topod.alloc.windows).
- Without `near`, the home node is the one with the most free CPUs among those that can
  hold the whole request (ties: the lower load, then the lower node id).
- Levels: at 'good' and 'best' (the default is the daemon's, 'good') every CPU is on the
  home node, or the request waits / is refused (insufficient_cpus). At 'any' the home
  node gives what it has and the rest comes from the other nodes nearest it by SLIT
  distance (ties: the lower id); the decision marks cpu_fallback and names the nodes.
- A request no free state could ever serve (more CPUs than the home node's usable cores
  at 'good'/'best', than any node's without `near`, than the host's at 'any') is
  insufficient_cpus with retryable false; otherwise insufficient_cpus is retryable.
- The decision's memory_nodes (and numa_nodes) are the nodes its CPUs come from; its
  level is 'best' when they all come from the home node, else 'any'.
"""

from __future__ import annotations

from collections.abc import Mapping

from topod.alloc.cores import node_cores
from topod.alloc.errors import InsufficientCpusError
from topod.alloc.near import Near, resolve_near
from topod.alloc.nodecores import CoreMap, NodeCores, usable_cores
from topod.alloc.request import Decision, FreeState, Performance, Request
from topod.alloc.windows import NOWHERE, pick_cores
from topod.cpulist import format_cpulist
from topod.model import Topology

NO_GPUS = Performance(relative_bandwidth=1.0, weakest_pair=None, weakest_pair_gbps=None, level_floors={})


def decide_cpus(topology: Topology, state: FreeState, request: Request, cmap: CoreMap) -> Decision:
    near = resolve_near(topology, request.near) if request.near else None
    reserved = set(state.reserved_cpus)
    now = node_cores(topology, reserved | set(state.busy_cpus), cmap)
    free = _cpus_per_node(now)
    ever = _cpus_per_node(node_cores(topology, reserved, cmap))
    wanted = request.cpus
    spread = request.level == "any"
    home = near.node if near is not None else _home_without_near(free, ever, wanted, spread, state.node_load)
    _check_capacity(topology, home, near, free, ever, wanted, spread)
    order = [home] + (_nearest(topology, home) if spread else [])
    cpus, used, scattered = _take(cmap, now, order, wanted, near.local_cpus if near is not None else NOWHERE, home)
    reasons = [_summary(wanted, cpus, home, near)]
    if len(cpus) > wanted:
        reasons.append(f"cpus {wanted} rounded up to whole physical cores ({len(cpus)} CPUs)")
    if scattered:
        reasons.append(f"no {wanted} contiguous free CPUs on node {home}; cores are not contiguous")
    fallback = len(used) > 1
    if fallback:
        others = [v for v in used if v != home]
        reasons.append(f"node {home} has {free.get(home, 0)} free CPUs: the rest from node(s) "
                       f"{', '.join(map(str, others))}, the nearest with free cores (level 'any')")
    nodes = tuple(sorted(used))
    return Decision(
        gpus=(), placements=(), cpus={}, memory_nodes=nodes, numa_nodes=nodes, cost=0.0, best_cost=0.0,
        level="any" if fallback else "best", requested_level=request.level, satisfaction=1.0,
        performance=NO_GPUS, exact=True, cpu_fallback=fallback, reasons=tuple(reasons),
        cpu_only=tuple(sorted(cpus)), near=request.near,
    )


def _cpus_per_node(cores: Mapping[int, NodeCores]) -> dict[int, int]:
    """node -> CPUs of its usable whole cores."""
    return {node: sum(len(core) for core in usable_cores(node_cores_)) for node, node_cores_ in cores.items()}


def _home_without_near(free: dict[int, int], ever: dict[int, int], wanted: int, spread: bool,
                       load: Mapping[int, float]) -> int:
    """The node with the most free CPUs among those holding the whole request now (ties:
    lower load, lower id); at 'any' when none does, the node with the most free CPUs (the
    rest comes from the nodes nearest it)."""
    def rank(node: int) -> tuple:
        return -free[node], load.get(node, 0.0), node

    fitting = [node for node, cpus in free.items() if cpus >= wanted]
    if fitting:
        return min(fitting, key=rank)
    if not free:
        raise _never(f"{wanted} CPUs requested; this host has no usable CPUs")
    if spread:
        return min(free, key=rank)
    most = max(ever.values(), default=0)
    if wanted > most:
        raise _never(f"{wanted} CPUs requested; no NUMA node of this host has that many usable CPUs (the most: "
                     f"{most}, whole cores that are not isolated, nohz_full or reserved); level 'any' would take "
                     "them from several nodes")
    raise InsufficientCpusError(f"{wanted} CPUs requested; no NUMA node has that many free now (the most: "
                                f"{max(free.values())}); level 'any' would take them from several nodes")


def _check_capacity(topology: Topology, home: int, near: Near | None, free: dict[int, int], ever: dict[int, int],
                    wanted: int, spread: bool) -> None:
    where = f"near {near.what}" if near is not None else f"node {home}"
    if spread:
        total, total_free = sum(ever.values()), sum(free.values())
        if wanted > total:
            raise _never(f"{wanted} CPUs requested; this host has {total} usable CPUs in all (whole cores that "
                         "are not isolated, nohz_full or reserved)")
        if wanted > total_free:
            raise InsufficientCpusError(f"{wanted} CPUs requested; {total_free} of the host's {total} usable CPUs "
                                        "are free")
        return
    if wanted > ever.get(home, 0):
        raise _never(f"{wanted} CPUs requested on {where}, which has {ever.get(home, 0)} usable CPUs (whole cores "
                     "that are not isolated, nohz_full or reserved); level 'any' would take the rest from the "
                     "nearest nodes")
    if wanted > free.get(home, 0):
        raise InsufficientCpusError(f"{wanted} CPUs requested on {where}, which has {free.get(home, 0)} free of "
                                    f"its {ever[home]} usable CPUs (level 'any' would take the rest from the "
                                    "nearest nodes)")


def _never(message: str) -> InsufficientCpusError:
    """insufficient_cpus that no release can cure (retryable false)."""
    error = InsufficientCpusError(message)
    error.retryable = False
    return error


def _take(cmap: CoreMap, now: Mapping[int, NodeCores], order: list[int], wanted: int, local: frozenset[int],
          home: int) -> tuple[list[int], list[int], bool]:
    """(the CPUs, the nodes they came from in `order`, whether the home node's were not
    contiguous): whole cores, the home node's first, then each node of `order` in turn."""
    taken: dict[int, int] = {}
    cpus: list[int] = []
    used: list[int] = []
    scattered = False
    for node in order:
        remaining = wanted - len(cpus)
        if remaining <= 0:
            break
        cores = now.get(node)
        if cores is None:
            continue
        available = sum(len(core) for i, core in enumerate(cores.all_cores)
                        if (cores.free & ~taken.get(node, 0)) >> i & 1)
        if not available:
            continue
        said: list[str] = []
        picked = pick_cores(cmap, cores, taken, min(remaining, available), local if node == home else NOWHERE,
                            said, 0)
        if picked is None:  # not reached: `available` CPUs are free, so the scan finds them
            continue
        scattered |= node == home and bool(said)
        for v, bits in picked[1]:
            taken[v] = taken.get(v, 0) | bits
        cpus.extend(picked[0])
        used.append(node)
    return cpus, used, scattered


def _nearest(topology: Topology, home: int) -> list[int]:
    """The other nodes with CPUs, nearest to `home` first by SLIT (ties: lower id)."""
    origin = topology.node(home)
    others = [node for node in topology.numa_nodes if node.has_cpus and node.id != home]
    return [node.id for node in sorted(others, key=lambda n: (origin.distances.get(n.id, 255) if origin else 0, n.id))]


def _summary(wanted: int, cpus: list[int], home: int, near: Near | None) -> str:
    where = f"near {near.what}" if near is not None else f"on node {home}, the node with the most free CPUs"
    return f"{wanted} CPUs without GPUs {where}: CPUs {format_cpulist(sorted(cpus))}"
