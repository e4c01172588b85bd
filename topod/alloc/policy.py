"""Scheduling policy as pure functions: priority aging, topology weight, back-pressure.

- effective priority = priority + min(max_aging_boost, waited / aging_seconds): the queue
  serves the highest first, so a long wait eventually beats a small priority gap.
- topology weight tau in (0, 1]: how much the engine cares about GPU-GPU cost versus
  packing. 1.0 for normal requests. Low-priority requests (priority < low_priority_below)
  and short ones (ttl <= short_job_seconds) start at low_topology_weight, so they take
  fragmented leftovers (GPUs in partly used nodes, even across NUMA nodes at level
  'any') and keep whole nodes free for jobs that need them; tau grows linearly to 1.0
  over topology_aging_seconds of waiting. Level 'best' always uses tau = 1.
- back-pressure: a node whose load exceeds backpressure_threshold is overloaded by
  (load - threshold) / (1 - threshold) in [0, 1]. The engine first finds the best set
  ignoring load (true cost c*); if that set touches an overloaded node it searches again
  with a per-GPU penalty tolerance x max(c*, cheapest pair) x overload / k, so the set
  it moves to costs at most c* x (1 + tolerance) (plus tie-break terms), and it moves
  only to less loaded nodes.
Preemption planning lives in topod.alloc.preemption (it runs the engine).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicySettings:
    aging_seconds: float = 60.0
    max_aging_boost: float = 10.0
    low_priority_below: int = 0
    short_job_seconds: float = 600.0
    low_topology_weight: float = 0.25
    topology_aging_seconds: float = 300.0
    backpressure_tolerance: float = 0.1
    backpressure_threshold: float = 0.7
    search_budget: int = 200_000
    nics: str = "shared"  # [alloc] nics: exclusive | shared | none (topod.alloc.nics)


MIN_TOPOLOGY_WEIGHT = 0.05  # tau is a divisor in the engine's objective


def effective_priority(priority: int, waited_seconds: float, aging_seconds: float, max_boost: float) -> float:
    """A waiting request gains one priority step per aging_seconds, up to max_boost."""
    if aging_seconds <= 0:
        return float(priority)
    return priority + min(max_boost, max(0.0, waited_seconds) / aging_seconds)


def is_low_preference(priority: int, ttl_seconds: float | None, settings: PolicySettings) -> bool:
    """Low-priority or short requests: they may fill fragments."""
    short = ttl_seconds is not None and ttl_seconds <= settings.short_job_seconds
    return priority < settings.low_priority_below or short


def topology_weight(priority: int, waited_seconds: float, ttl_seconds: float | None,
                    settings: PolicySettings) -> float:
    if not is_low_preference(priority, ttl_seconds, settings):
        return 1.0
    base = max(MIN_TOPOLOGY_WEIGHT, min(1.0, settings.low_topology_weight))
    if settings.topology_aging_seconds <= 0:
        return base
    grown = min(1.0, max(0.0, waited_seconds) / settings.topology_aging_seconds)
    return base + (1.0 - base) * grown


def packing_scale(tau: float, mean_weight: float, gpus: int) -> float:
    """Weight of the per-GPU packing term phi in [0, 1] (share of the GPU's groups still
    free). A GPU in a k-set takes part in k-1 pairs, so per-GPU cost is about
    mean_weight x (k-1)/2; (1 - tau)/tau scales packing against it."""
    tau = max(MIN_TOPOLOGY_WEIGHT, min(1.0, tau))
    return (1.0 - tau) / tau * mean_weight * max(gpus - 1, 1) / 2.0


def overload(load: float, threshold: float) -> float:
    """How far past the threshold a node's load is, in [0, 1]."""
    load = min(1.0, max(0.0, float(load)))
    if threshold >= 1.0 or load <= threshold:
        return 0.0
    return (load - threshold) / (1.0 - threshold)


def backpressure_penalty(node_load: dict[int, float], base_cost: float, floor: float, gpus: int,
                         settings: PolicySettings) -> dict[int, float]:
    """node -> per-GPU penalty; empty when nothing is overloaded or tolerance is 0."""
    if settings.backpressure_tolerance <= 0:
        return {}
    scale = settings.backpressure_tolerance * max(base_cost, floor) / max(gpus, 1)
    out = {node: scale * overload(load, settings.backpressure_threshold) for node, load in node_load.items()}
    return {node: value for node, value in out.items() if value > 0}
