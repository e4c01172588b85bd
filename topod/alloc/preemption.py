"""Which leases to preempt for a waiting request (pure: it only runs the engine).

plan_preemption returns the minimal set of victims: fewest leases, then fewest GPUs,
then lowest priorities, among leases that are preemptible, active and of strictly
LOWER priority than the request (never equal or higher), such that with their GPUs
and CPUs free the request is granted at its own level. None when no such set exists or
when the request fits already. The daemon then asks the victims to finish (gentle
preemption) and grants when they release or their grace period ends.

Search: candidates sorted by (priority, GPUs); all subsets of 1, 2 and 3 leases are
tried in order of (size, GPUs, priorities) within a budget of engine calls; past that,
the set the engine would pick with every candidate freed is shrunk greedily (dropping
leases while the request still fits), which is minimal by inclusion.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import combinations
from typing import Protocol

from topod.alloc.engine import allocate
from topod.alloc.policy import PolicySettings
from topod.alloc.nics import lease_nic_keys
from topod.alloc.request import FreeState, Request
from topod.distance import DistanceModel
from topod.errors import AllocationError
from topod.model import Topology

EXACT_UP_TO = 3  # leases in a victim set tried exhaustively
CALL_BUDGET = 400


class LeaseLike(Protocol):
    id: str
    priority: int
    preemptible: bool
    gpus: tuple[int, ...]
    cpus: tuple[int, ...]


def plan_preemption(topology: Topology, distances: DistanceModel, state: FreeState, request: Request,
                    leases: Iterable[LeaseLike], policy: PolicySettings | None = None) -> tuple | None:
    policy = policy or PolicySettings()
    candidates = sorted((lease for lease in leases if _may_preempt(lease, request)),
                        key=lambda lease: (lease.priority, len(lease.gpus), lease.id))
    if not candidates or _fits(topology, distances, state, request, (), policy) is not None:
        return None
    everything = _fits(topology, distances, state, request, candidates, policy)
    if everything is None:
        return None
    calls = 0
    for size in range(1, min(EXACT_UP_TO, len(candidates)) + 1):
        subsets = sorted(combinations(candidates, size),
                         key=lambda group: (sum(len(v.gpus) for v in group), sum(v.priority for v in group)))
        for group in subsets:
            calls += 1
            if calls > CALL_BUDGET:
                return _shrink(topology, distances, state, request, candidates, everything, policy)
            if _fits(topology, distances, state, request, group, policy) is not None:
                return tuple(group)
    return _shrink(topology, distances, state, request, candidates, everything, policy)


def _may_preempt(lease: LeaseLike, request: Request) -> bool:
    if getattr(lease, "state", "active") != "active":
        return False
    return bool(lease.preemptible) and int(lease.priority) < int(request.priority)


def _fits(topology, distances, state: FreeState, request: Request, victims: Sequence[LeaseLike],
          policy: PolicySettings):
    freed_gpus = {g for lease in victims for g in lease.gpus}
    freed_cpus = {c for lease in victims for c in lease.cpus}
    freed_nics = {key for lease in victims if getattr(lease, "decision", None) is not None
                  for key in lease_nic_keys(lease.decision.placements)}
    trial = replace(state, busy_gpus=frozenset(state.busy_gpus - freed_gpus),
                    busy_cpus=frozenset(state.busy_cpus - freed_cpus),
                    busy_nics=frozenset(state.busy_nics - freed_nics))
    try:
        return allocate(topology, distances, trial, request, policy)
    except AllocationError:
        return None


def _shrink(topology, distances, state, request, candidates, decision, policy) -> tuple:
    """Leases the engine's own choice touches, then drop any the request can do without."""
    wanted = set(decision.gpus)
    chosen = [lease for lease in candidates if wanted & set(lease.gpus)]
    if not chosen or _fits(topology, distances, state, request, chosen, policy) is None:
        chosen = list(candidates)  # the CPUs it needs sit in other leases too
    for lease in sorted(chosen, key=lambda v: (-v.priority, -len(v.gpus))):
        trial = [v for v in chosen if v is not lease]
        if trial and _fits(topology, distances, state, request, trial, policy) is not None:
            chosen = trial
    return tuple(chosen)
