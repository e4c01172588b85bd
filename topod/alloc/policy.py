"""Scheduling policy (pure): priority aging and the choice of preemption victims."""

from __future__ import annotations

from dataclasses import dataclass, replace

from topod.errors import AllocationError


@dataclass(frozen=True, slots=True)
class PolicySettings:
    aging_seconds: float = 60.0
    backpressure_tolerance: float = 0.1


def effective_priority(priority: int, waited_seconds: float, aging_seconds: float, max_boost: float) -> float:
    """A waiting request gains one priority step per aging_seconds, up to max_boost."""
    if aging_seconds <= 0:
        return float(priority)
    return priority + min(max_boost, max(0.0, waited_seconds) / aging_seconds)


def plan_preemption(topology, distances, state, request, leases):
    """The fewest lower-priority preemptible leases whose GPUs would let `request` be met
    at its level; [] when none would. Never equal or higher priority."""
    from topod.alloc.engine import allocate

    victims = sorted((l for l in leases if l.preemptible and l.priority < request.priority),
                     key=lambda l: (l.priority, -len(l.gpus), l.created))
    if not victims:
        return []

    def fits(chosen) -> bool:
        freed_gpus = {g for lease in chosen for g in lease.gpus}
        freed_cpus = {c for lease in chosen for c in lease.cpus}
        trial = replace(state, busy_gpus=frozenset(state.busy_gpus - freed_gpus),
                        busy_cpus=frozenset(state.busy_cpus - freed_cpus))
        try:
            allocate(topology, distances, trial, request)
        except AllocationError:
            return False
        return True

    for victim in victims:
        if fits([victim]):
            return [victim]
    chosen = []
    for victim in victims:
        chosen.append(victim)
        if fits(chosen):
            return chosen
    return []
