"""The allocation engine (pure): Topology + distances + what is taken + a request -> Decision.

Cost of a GPU set = the sum of DistanceModel weights over all its pairs (NVLink and
NVSwitch pairs cheapest, then PIX < PXB < PHB < NODE < SYS). GPUs in one NVSwitch island
are all-to-all: every pair costs the island's NVS weight.

Levels (docs/api.md, "Allocating", says the same):
- good: the set spans no more NUMA nodes than necessary. On the empty host, with the
  request's model/memory filter, find the fewest nodes whose GPUs (plus the nodes of
  must_include GPUs) can hold the size: one node whenever the size fits in one node, so
  no pair crosses nodes; else that minimum number of nodes.
- best: good, and the cost equals the lowest cost any good set of this size can have on
  this host (computed on the empty host, same filter and must_include; cached per
  DistanceModel).
- any: the cheapest set among the free GPUs, whatever it spans.
A request at a level gets the cheapest free set that meets it, or the error
'level_unreachable' (retryable: the daemon's queue may wait). The decision reports the
strongest level its set reaches, which may be above the one asked for.

How a decision is made:
1. Filter: free GPUs matching model (case-insensitive substring) and min_memory_mib;
   must_include GPUs must be among them. When cpus_per_gpu > 0, a node can take only as
   many GPUs as its free whole cores can serve (level 'any' retries without this limit
   and then takes CPUs from the nearest node, marked cpu_fallback).
2. Search (topod.alloc.viewsearch, over topod.alloc.search): exact branch and bound
   over twin classes for the minimum of  cost + 1e-5 x (pairs crossing NUMA nodes) +
   per-GPU terms:
   - packing phi(x) = mean over x's groups (NUMA node, root complex, PCIe switch,
     NVLink island; groups of one GPU ignored) of the share of that group still free.
     Weighted 1e-7 it only breaks ties: among equal-cost sets, take GPUs from partly
     used groups so the free ones stay together (least fragmentation). Low-priority or
     short requests weigh it much more (topod.alloc.policy), so they fill fragments.
   - look-ahead: where the host's census of minimum-cost sets exists (hostview: at most
     CENSUS_LIMIT twin-class mixes, up to about 16 GPUs, and not all sets equal), every
     set within k x 1e-7 of the minimum objective (equal cost, differing only in phi) is
     listed (ties.solve_ties). On hosts of at most packing.SERVABLE_MIXES class mixes
     (8 GPUs) the one leaving the most requests servable at the host's best wins
     (disjoint host-minimum sets, summed over sizes), then the one that would leave the
     most once any one running lease ends (FreeState.lease_gpus: GPUs a lease holds come
     back together); then, and alone on bigger hosts, the one leaving the most
     host-minimum sets wholly free (topod.alloc.packing.look_ahead); phi breaks what is
     left. It never trades cost for packing.
     "Host-minimum" by the search's own costs (the node-crossing term included), so a
     pair the search would never grant first (a DGX-1's cross-socket NVLinks) is not
     kept at the expense of one it would.
   - back-pressure: a per-GPU penalty for overloaded nodes, in a second search only when
     the first set touches one (topod.alloc.policy).
   The search is exact unless it exhausts PolicySettings.search_budget nodes; then the
   decision says exact=false. One GPU with nothing forced or filtered, no NIC term, no
   node past the back-pressure threshold and no census (the API's commonest request on a
   big host) is that search's answer taken directly: the cheapest free GPU per kind (GPUs
   with the same groups share phi), by bit masks (cheapest_one).
3. CPUs (topod.alloc.cores), satisfaction (share of pairs on one NUMA node, 1.0 for one
   GPU) and the performance estimate (topod.alloc.estimate).

A request for 0 GPUs is a lease of CPUs alone: topod.alloc.cpulease decides it, on the
view's core map, before any of the above.
"""

from __future__ import annotations

from dataclasses import dataclass

from topod.alloc.cores import assign_auto, assign_cpus, node_capacity, node_cores, wants_cpus
from topod.alloc.coretables import auto_cap, auto_share, full_shares, view_core_map
from topod.alloc.cpulease import decide_cpus
from topod.alloc.eligibility import eligible_gpus, forced_gpus
from topod.alloc.errors import AllocationError, InsufficientCpusError, InsufficientGpusError, LevelUnreachableError
from topod.alloc.estimate import weakest
from topod.alloc.grading import (decision_summary, level_floors, level_of, reference_rate, satisfaction,
                                 set_cost, set_performance)
from topod.alloc.hostview import HostView, best_set_census, fresh_view, host_view
from topod.alloc.nics import pair_nics, tie_break_terms
from topod.alloc.packing import cheapest_one, group_kinds, lease_classes, phi_of, prepare_servable, weighs_servable
from topod.alloc.policy import PolicySettings, backpressure_penalty, overload, packing_scale, topology_weight
from topod.alloc.reference import good_node_limit, reference_set
from topod.alloc.request import Decision, FreeState, Placement, Request
from topod.alloc.search import SearchResult
from topod.alloc.viewsearch import DELTA_FRAG, search_view
from topod.distance import DistanceModel
from topod.model import Topology

__all__ = ["Assessment", "FreeState", "allocate", "assess", "prepare", "set_cost"]

DEFAULT_POLICY = PolicySettings()
# Decisions kept per host view, divided by its GPUs (sized with the searches,
# viewsearch.SEARCH_MEMO_GPUS): 256 on 8 GPUs, 32 on 64.
DECISION_MEMO_GPUS = 2_048


def allocate(topology: Topology, distances: DistanceModel, state: FreeState, request: Request,
             policy: PolicySettings = DEFAULT_POLICY, *, waited_seconds: float = 0.0,
             ttl_seconds: float | None = None) -> Decision:
    view = host_view(topology, distances)
    if not request.gpus:  # a lease without GPUs: CPUs near a device or node (topod.alloc.cpulease)
        return decide_cpus(view.topology, state, request, view_core_map(view))
    tau = 1.0 if request.level == "best" else topology_weight(request.priority, waited_seconds, ttl_seconds, policy)
    return _remembered(view, state, request, policy, tau)


def _remembered(view: HostView, state: FreeState, request: Request, policy: PolicySettings, tau: float) -> Decision:
    """A decision is a function of the view, the free state, the request, the policy and
    tau alone, and a frozen value: the last DECISION_MEMO_GPUS / GPUs are kept per view
    (oldest out), so a state and request seen before (an allocate/release cycle, the
    empty host after prepare) cost a lookup. Refusals are not kept: they raise before any search or after
    a memoised one."""
    # The lease partition moves only the look-ahead's choice: a host where it does not
    # weigh them (packing.weighs_servable) keeps a state's decision whatever leases hold
    # its busy GPUs.
    leases = frozenset(map(frozenset, state.lease_gpus)) if state.lease_gpus and weighs_servable(view) else None
    key = (request, policy, tau, frozenset(state.busy_gpus), frozenset(state.busy_cpus),
           frozenset(state.reserved_cpus), tuple(sorted(state.node_load.items())), frozenset(state.busy_nics),
           tuple(sorted(state.nic_use.items())), leases)
    memo = view.decision_memo
    try:
        decision = memo.get(key)
    except TypeError:  # a request built in code with a list where the schema gives a tuple
        return _decide(view, state, request, policy, tau)
    if decision is None:
        decision = memo[key] = _decide(view, state, request, policy, tau)
        if len(memo) > DECISION_MEMO_GPUS // view.n:
            del memo[next(iter(memo))]
    return decision


def _decide(view: HostView, state: FreeState, request: Request, policy: PolicySettings, tau: float) -> Decision:
    """The decision; `tau` is the request's topology weight (policy.topology_weight; 1.0
    at level best), the only thing the wait and the ttl change."""
    topology, distances = view.topology, view.distances
    k = request.gpus
    reasons: list[str] = []
    if view.n == 0:
        raise InsufficientGpusError("this host has no GPUs", retryable=False)
    eligible = eligible_gpus(view, request, reasons)
    must = forced_gpus(view, request, eligible)
    if k > len(eligible):
        models = f" (its models: {', '.join(sorted({g.name or 'unnamed' for g in view.gpus}))})" if request.model else ""
        raise InsufficientGpusError(f"{k} GPUs requested; this host has {len(eligible)} matching GPUs{models}",
                                    retryable=False)
    busy = set(map(view.position.get, state.busy_gpus))  # None for a GPU not on this host
    busy.discard(None)
    for p in sorted(must & busy):
        raise InsufficientGpusError(f"must_include GPU {view.gpus[p].index} is leased")
    free = [p for p in eligible if p not in busy]
    if len(free) < k:
        raise InsufficientGpusError(f"{k} GPUs requested; {len(free)} of the {len(eligible)} matching GPUs are free")
    limit = good_node_limit(view, k, eligible, must)
    ref_cost, ref_members = reference_set(view, k, eligible, must, limit, policy.search_budget)
    scale = packing_scale(tau, view.mean_weight, k) if tau < 1.0 else 0.0
    if scale:
        reasons.append(f"topology weight {tau:.2f} (low priority or short job): fragments preferred")
    # GPU-NIC distance: a tie-break below every GPU-GPU cost step (topod.alloc.nics)
    if policy.nics != "exclusive" or not state.busy_nics:  # every NIC usable: per GPU, kept per view
        key = ("nic_terms", policy.nics, request.nics_per_gpu)
        terms = view.cache.get(key)
        if terms is None:
            terms = view.cache[key] = tie_break_terms(topology, distances, view.gpus, policy.nics,
                                                      request.nics_per_gpu, state.busy_nics)
            if not any(terms):
                terms = view.cache[key] = ()  # no NIC term anywhere: nothing to add per GPU
        nic_terms = [terms[p] for p in free] if terms else ()
    else:
        nic_terms = tie_break_terms(topology, distances, [view.gpus[p] for p in free], policy.nics,
                                    request.nics_per_gpu, state.busy_nics)
    weight = DELTA_FRAG + scale
    # One GPU, nothing forced or filtered, no per-GPU NIC term, no back-pressure and no
    # look-ahead census: the cheapest free GPU by phi alone (cheapest_one), no per-GPU
    # terms built. Else (or when it finds none) the general search, with them.
    calm = _calm(state, policy)
    one = k == 1 and not must and eligible is view.everyone and not any(nic_terms) and calm and not best_set_census(view)
    unary = None if one else _unary(view, busy, free, weight, nic_terms)
    max_nodes = limit if request.level in ("best", "good") else None
    excluded = set(state.busy_cpus).union(state.reserved_cpus)
    cmap = view_core_map(view)
    auto = request.cpus_per_gpu == "auto"
    per_gpu = auto_share(view, cmap, state) if auto else request.cpus_per_gpu
    node_cap = None
    now = node_cores(topology, excluded, cmap) if wants_cpus(per_gpu) else None  # free cores, once
    if auto and per_gpu:
        # auto gives fewer cores where the empty host cannot give full shares, so its
        # constraint never forces a worse GPU set than the cores of the empty host allow.
        node_cap = auto_cap(view, cmap, state, per_gpu, excluded, now)
    elif wants_cpus(per_gpu):
        capacity = node_capacity(topology, excluded, per_gpu, cmap, now)
        node_cap = {v: capacity.get(v, 0) for v in set(view.node)}
    leases = () if one else _lease_shape(view, state, busy)
    result = (cheapest_one(view, busy, weight, node_cap) if one else
              search_view(view, free, must, unary, node_cap, max_nodes, k, policy.search_budget, busy, leases))
    if result is None:
        if unary is None:
            unary = _unary(view, busy, free, weight, nic_terms)
        result = _without_cpu_limit(view, free, must, unary, node_cap, max_nodes, k, policy, request, limit, busy,
                                    leases)
    if not calm:
        result = _backpressure(view, free, must, unary, node_cap if node_cap and result_fits(view, result, node_cap)
                               else None, max_nodes, k, policy, state, result, reasons, busy, leases)
    members = list(result.members)
    cost = set_cost(view, members)
    nodes = sorted({view.node[p] for p in members})
    level = level_of(len(nodes), limit, cost, ref_cost, k)
    if request.level == "best" and level != "best":
        raise LevelUnreachableError(f"the cheapest free set of {k} GPUs costs {cost:.2f}; level 'best' needs "
                                    f"{ref_cost:.2f} (the host's minimum) within {limit} NUMA node(s)")
    gpus = [view.gpus[p] for p in members]
    if auto and per_gpu and not full_shares(view, cmap, state, per_gpu, members):
        cores = assign_auto(topology, gpus, per_gpu, excluded, set(state.reserved_cpus),
                            allow_fallback=request.level == "any", cmap=cmap)
    else:
        cores = assign_cpus(topology, gpus, per_gpu, excluded, allow_fallback=request.level == "any", cmap=cmap,
                            now=now)
    reasons.extend(cores.reasons)
    reasons.insert(0, decision_summary(k, cost, ref_cost, level, len(nodes), limit))
    if not result.exact:
        reasons.append(f"search budget of {policy.search_budget} nodes ran out: best set found, not proven optimal")
    chosen = set(members)
    by_index = sorted(gpus, key=lambda g: g.index)
    # The other free GPUs matter to exclusive NICs only (what they would want next).
    others = [view.gpus[p] for p in free if p not in chosen] if policy.nics == "exclusive" else ()
    nics, nic_reasons = pair_nics(topology, distances, by_index, policy.nics, request.nics_per_gpu,
                                  state.busy_nics, state.nic_use, others)
    reasons.extend(nic_reasons)
    placements = tuple(Placement(g.index, g.address, g.numa_node, cores.cpus[g.index], cores.cpu_node[g.index],
                                 nics.get(g.index, ()))
                       for g in by_index)
    return Decision(
        gpus=tuple(p.index for p in placements),
        placements=placements,
        cpus={p.index: p.cpus for p in placements},
        memory_nodes=_memory_nodes(gpus, request.gpu_memory_nodes),
        numa_nodes=tuple(sorted({g.numa_node for g in gpus if g.numa_node is not None})),
        cost=cost,
        best_cost=ref_cost,
        level=level,
        requested_level=request.level,
        satisfaction=satisfaction(view, members),
        performance=set_performance(view, members, ref_members, limit, reasons),
        exact=result.exact,
        cpu_fallback=cores.fallback,
        reasons=tuple(reasons),
    )


def prepare(topology: Topology, distances: DistanceModel, state: FreeState | None = None,
            policy: PolicySettings = DEFAULT_POLICY, sizes: range | list[int] | None = None, *,
            fresh: bool = False) -> HostView:
    """What the first decision of each size would compute, computed now (the daemon calls
    this when the topology changes): the host view, the census, core map, auto share and
    per size the good-node limit, the reference set (best cost) and the level floors, all
    for unfiltered requests. A first decision then costs what a warm one does. Sizes by
    default: 1-16 and every power of two up to the host's GPUs, and all of them (on 64
    GPUs the other sizes' references take ~1 s together, 30-60 ms each for 36-44 GPUs;
    the first request of such a size computes its own).

    fresh=True builds a view of its own, not memoised on the model, and fills that: the
    daemon runs this in a worker thread and hands the result to hostview.install_view on
    its loop, so a decision made meanwhile never sees a half-filled cache."""
    view = fresh_view(topology, distances) if fresh else host_view(topology, distances)
    if view.n == 0:
        return view
    state = state or FreeState()
    best_set_census(view)
    prepare_servable(view)
    group_kinds(view)
    cmap = view_core_map(view)
    share = auto_share(view, cmap, state)
    if share:
        full_shares(view, cmap, state, share, [])
        auto_cap(view, cmap, state, share, set(state.reserved_cpus))
    if "min_weight" not in view.cache:
        view.cache["min_weight"] = min((w for row in view.weight for w in row if w > 0), default=1.0)
    everyone = list(range(view.n))
    if sizes is None:
        sizes = sorted({*range(1, min(view.n, 16) + 1), *(1 << b for b in range(view.n.bit_length())
                                                          if 1 << b <= view.n), view.n})
    for k in sizes:
        limit = good_node_limit(view, k, everyone, set())
        _, ref_members = reference_set(view, k, everyone, set(), limit, policy.search_budget)
        level_floors(view, ref_members, limit)
    # The default request of each size (default level, auto cores) decided once in this
    # free state: its search is then memoised and every lazily built table exists.
    for k in sizes:
        try:
            _remembered(view, state, Request(gpus=k, cpus_per_gpu="auto"), policy,
                        topology_weight(0, 0.0, None, policy))
        except AllocationError:
            pass  # not grantable in this state: the references above still stand
    return view


def _lease_shape(view: HostView, state: FreeState, busy: set[int]) -> tuple[tuple[int, ...], ...]:
    """The running leases as the look-ahead weighs them (packing.lease_classes); () where
    it does not (packing.weighs_servable) or no partition was given."""
    if not state.lease_gpus or not weighs_servable(view):
        return ()
    position = view.position
    return lease_classes(view, [{position[g] for g in gpus if g in position and position[g] in busy}
                                for gpus in state.lease_gpus])


def _unary(view: HostView, busy: set[int], free: list[int], weight: float, nic_terms) -> dict[int, float]:
    """Per free GPU its per-GPU objective term: packing phi weighted, plus its NIC term."""
    phi = phi_of(view, busy)  # per position (a list: no dict of the free GPUs built)
    if any(nic_terms):
        return {p: weight * phi[p] + term for p, term in zip(free, nic_terms)}
    return {p: weight * phi[p] for p in free}


def _calm(state: FreeState, policy: PolicySettings) -> bool:
    """No node loaded past the back-pressure threshold (or no back-pressure): whatever
    set is found, _backpressure keeps it (its penalty is empty)."""
    if not state.node_load or policy.backpressure_tolerance <= 0:
        return True
    threshold = policy.backpressure_threshold
    if threshold >= 0 and max(state.node_load.values()) <= threshold:
        return True  # each load, clamped to [0, 1], stays at or below it: nothing overloaded
    return not any(overload(load, threshold) for load in state.node_load.values())


def result_fits(view: HostView, result: SearchResult, node_cap: dict[int, int]) -> bool:
    counts: dict[int, int] = {}
    for p in result.members:
        counts[view.node[p]] = counts.get(view.node[p], 0) + 1
    return all(count <= node_cap.get(v, 0) for v, count in counts.items())


def _memory_nodes(gpus, with_gpu_memory: bool) -> tuple[int, ...]:  # noqa: ANN001 - list[Gpu]
    """The GPUs' CPU nodes; with gpu_memory_nodes also each GPU's own memory node (GPU
    memory exposed as a CPU-less NUMA node, as on Grace Hopper/Blackwell)."""
    nodes = {g.numa_node for g in gpus if g.numa_node is not None}
    if with_gpu_memory:
        nodes |= {g.memory_numa_node for g in gpus if g.memory_numa_node is not None}
    return tuple(sorted(nodes))


def _without_cpu_limit(view, free, must, unary, node_cap, max_nodes, k, policy, request, limit, busy,
                       leases) -> SearchResult:
    relaxed = (search_view(view, free, must, unary, None, max_nodes, k, policy.search_budget, busy, leases)
               if node_cap else None)
    if relaxed is None:
        raise LevelUnreachableError(f"no free set of {k} GPUs meets level '{request.level}': it needs the GPUs "
                                    f"within {limit} NUMA node(s)")
    if request.level != "any":
        wanted = "its fair share of" if request.cpus_per_gpu == "auto" else str(request.cpus_per_gpu)
        raise InsufficientCpusError(f"no free set of {k} GPUs at level '{request.level}' has "
                                    f"{wanted} free whole-core CPUs per GPU on each GPU's node")
    return relaxed


def _backpressure(view, free, must, unary, node_cap, max_nodes, k, policy, state, result, reasons,
                  busy, leases) -> SearchResult:
    if not state.node_load:
        return result
    floor = view.cache.get("min_weight")
    if floor is None:
        floor = min((w for row in view.weight for w in row if w > 0), default=1.0)
        view.cache["min_weight"] = floor
    penalty = backpressure_penalty(state.node_load, set_cost(view, list(result.members)), floor, k, policy)
    touched = sorted({view.node[p] for p in result.members if view.node[p] in penalty})
    if not touched:
        return result
    loaded = {p: unary[p] + penalty.get(view.node[p], 0.0) for p in free}
    moved = search_view(view, free, must, loaded, node_cap, max_nodes, k, policy.search_budget, busy, leases)
    if moved is None or moved.members == result.members:
        return result
    reasons.append(f"back-pressure: node(s) {', '.join(map(str, touched))} overloaded; moved to "
                   f"{', '.join(str(v) for v in sorted({view.node[p] for p in moved.members}))} "
                   f"within {policy.backpressure_tolerance:.0%} of the best cost")
    return moved


@dataclass(frozen=True, slots=True)
class Assessment:
    level: str
    cost: float
    best_cost: float
    satisfaction: float
    relative_bandwidth: float


def assess(topology: Topology, distances: DistanceModel, gpus: list[int]) -> Assessment:
    """Judge any GPU set (another allocator's, say) by topod's levels, unfiltered request."""
    view = host_view(topology, distances)
    members = [view.position[g] for g in gpus]
    k = len(members)
    everyone = list(range(view.n))
    limit = good_node_limit(view, k, everyone, set())
    ref_cost, ref_members = reference_set(view, k, everyone, set(), limit, DEFAULT_POLICY.search_budget)
    cost = set_cost(view, members)
    pair = weakest(members, view.bandwidth)
    rate = view.bandwidth[pair[0]][pair[1]] / reference_rate(view, ref_members) if pair else 1.0
    return Assessment(level_of(len({view.node[p] for p in members}), limit, cost, ref_cost, k), cost, ref_cost,
                      satisfaction(view, members), min(1.0, rate))
