"""Load-aware refinement of a spread placement (pure).

The count-balanced placement treats every IRQ alike; measured load does not. Starting
from it, the hottest IRQs move off the most loaded CPU of their pool, by a move (from a
CPU holding one IRQ more to one holding one fewer) or a swap (with a colder IRQ), so the
per-CPU IRQ counts stay within one of each other. Hysteresis keeps a steady load from
flapping: a move must cut the busier CPU's load by at least `min_gain` (a share), and an
IRQ moved within its cooldown is not moved for load at all.
"""

from __future__ import annotations

from collections.abc import Mapping

Weights = Mapping[int, float]
_DESTINATIONS = 8  # least-loaded CPUs tried per step
_CANDIDATES = 4  # hottest (and coldest) IRQs tried per CPU


Affinity = Mapping[int, "tuple[int, ...] | None"]


def delivered_cpu(irqs: Mapping[int, int], effective: Affinity, requested: Affinity) -> dict[int, int]:
    """Where each IRQ is delivered now (its first effective CPU), for the 'before' figure."""
    out = {}
    for irq in irqs:
        cpus = effective.get(irq) or requested.get(irq)
        if cpus:
            out[irq] = cpus[0]
    return out


def background_load(irqs: set[int], weights: Weights, effective: Affinity, requested: Affinity) -> dict[int, float]:
    """Load of the IRQs the planner does not spread, on the CPUs they are delivered to."""
    load: dict[int, float] = {}
    for irq in irqs:
        cpus = effective.get(irq) or requested.get(irq)
        if cpus and weights.get(irq):
            for cpu in cpus:
                load[cpu] = load.get(cpu, 0.0) + weights[irq] / len(cpus)
    return load


def cpu_loads(assignment: Mapping[int, int], weights: Weights, background: Mapping[int, float],
              cpus: tuple[int, ...] | set[int]) -> dict[int, float]:
    load = {cpu: background.get(cpu, 0.0) for cpu in cpus}
    for irq, cpu in assignment.items():
        if cpu in load:
            load[cpu] += weights.get(irq, 0.0)
    return load


def imbalance(assignment: Mapping[int, int], weights: Weights, background: Mapping[int, float],
              groups: Mapping[tuple[int, ...], list[int]]) -> float | None:
    """max / mean load over the CPUs of the spread pools; None when nothing is loaded."""
    cpus = {cpu for order in groups for cpu in order}
    if not cpus:
        return None
    load = cpu_loads(assignment, weights, background, cpus)
    mean = sum(load.values()) / len(load)
    return None if mean <= 0 else max(load.values()) / mean


def refine(assignment: Mapping[int, int], groups: Mapping[tuple[int, ...], list[int]], weights: Weights,
           background: Mapping[int, float], cooling: frozenset[int], min_gain: float) -> tuple[dict[int, int], dict[int, str]]:
    """(new irq -> cpu, irq -> why it moved for load)."""
    placed = dict(assignment)
    moved: dict[int, str] = {}
    for order, irqs in groups.items():
        _refine_pool(order, [irq for irq in irqs if irq in placed], placed, weights, background, cooling,
                     min_gain, moved)
    return placed, moved


def _refine_pool(order: tuple[int, ...], irqs: list[int], placed: dict[int, int], weights: Weights,
                 background: Mapping[int, float], cooling: frozenset[int], min_gain: float,
                 moved: dict[int, str]) -> None:
    position = {cpu: i for i, cpu in enumerate(order)}
    on_cpu: dict[int, list[int]] = {cpu: [] for cpu in order}
    for irq in irqs:
        on_cpu[placed[irq]].append(irq)
    load = cpu_loads({irq: placed[irq] for irq in irqs}, weights, background, order)
    for _ in range(len(order)):  # bounded: a cycle moves at most one IRQ per CPU for load
        src = max(order, key=lambda c: (load[c], -position[c]))
        best = _best_step(src, order, on_cpu, load, weights, cooling, position)
        if best is None:
            break
        after, dst, hot, cold = best
        if after > load[src] * (1.0 - min_gain) or after >= load[src]:
            break  # not worth a move: the hysteresis that keeps steady load still
        reason = f"load: CPU {src} carried {_fmt(load[src])}, CPU {dst} {_fmt(load[dst])}"
        _move(hot, src, dst, on_cpu, load, weights, placed)
        moved[hot] = f"{reason}: moved to CPU {dst}"
        if cold is not None:
            _move(cold, dst, src, on_cpu, load, weights, placed)
            moved[cold] = f"{reason}: swapped to CPU {src}"


def _best_step(src: int, order: tuple[int, ...], on_cpu: Mapping[int, list[int]], load: Mapping[int, float],
               weights: Weights, cooling: frozenset[int], position: Mapping[int, int]
               ) -> tuple[float, int, int, int | None] | None:
    """The move or swap off src that leaves the lower max(load src, load dst)."""
    hot = sorted((irq for irq in on_cpu[src] if irq not in cooling and weights.get(irq, 0.0) > 0),
                 key=lambda irq: (-weights.get(irq, 0.0), irq))[:_CANDIDATES]
    if not hot:
        return None
    destinations = sorted((c for c in order if c != src), key=lambda c: (load[c], position[c]))[:_DESTINATIONS]
    best: tuple[float, int, int, int | None] | None = None
    for dst in destinations:
        cold = sorted((irq for irq in on_cpu[dst] if irq not in cooling),
                      key=lambda irq: (weights.get(irq, 0.0), irq))[:_CANDIDATES]
        for h in hot:
            w_h = weights.get(h, 0.0)
            options: list[int | None] = [None] if len(on_cpu[src]) > len(on_cpu[dst]) else []
            options += [c for c in cold if weights.get(c, 0.0) < w_h]
            for c in options:
                w_c = weights.get(c, 0.0) if c is not None else 0.0
                after = max(load[src] - w_h + w_c, load[dst] + w_h - w_c)
                if best is None or after < best[0]:
                    best = (after, dst, h, c)
    return best


def _move(irq: int, src: int, dst: int, on_cpu: dict[int, list[int]], load: dict[int, float],
          weights: Weights, placed: dict[int, int]) -> None:
    on_cpu[src].remove(irq)
    on_cpu[dst].append(irq)
    load[src] -= weights.get(irq, 0.0)
    load[dst] += weights.get(irq, 0.0)
    placed[irq] = dst


def _fmt(value: float) -> str:
    return f"{value:.3g}"
