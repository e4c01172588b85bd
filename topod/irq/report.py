"""What a cycle or a re-plan tells: the CycleReport the daemon publishes and serves, and
the immutable view other threads read (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable

from topod.irq.coexist import IrqbalanceState
from topod.irq.planner import Plan, PlanEntry
from topod.model import Topology
from topod.record import field, record


@record
class CycleReport:
    mode: str
    time: float  # wall clock, for the report
    applied: bool  # whether this cycle was allowed to write
    plan: Plan
    status: dict[int, str]  # irq -> unchanged | moved | pending | planned | managed | retrying | failed | held
    events: tuple[dict[str, object], ...]
    moves: int
    irqbalance: IrqbalanceState
    notes: tuple[str, ...]
    guidance: str | None = None
    rates: bool = False
    rediscover: bool = False  # /proc/interrupts' CPU columns changed: the topology is stale
    per_cpu_irqs: dict[int, int] = field(default_factory=dict)  # planned single-CPU IRQs per CPU
    kind: str = "full"  # full: read every IRQ | replan: a lease change, only the IRQs it affects
    failures: dict[str, object] = field(default_factory=dict)  # Failures.to_json() after this call

    def planned_cpus(self) -> dict[int, list[int]]:
        """{irq: [cpus]} where the plan puts each IRQ (what `topoctl doctor` takes)."""
        return {e.irq: list(e.planned or e.current or ()) for e in self.plan.entries if e.planned or e.current}

    def to_json(self) -> dict[str, object]:
        entries = []
        for entry in self.plan.entries:
            body = entry.to_json()
            body["status"] = self.status.get(entry.irq, "unchanged")
            entries.append(body)
        return {
            "kind": self.kind, "mode": self.mode, "time": self.time, "applied": self.applied, "moves": self.moves,
            "rates_measured": self.rates, "rediscover": self.rediscover,
            "imbalance_before": _round(self.plan.imbalance_before), "imbalance_after": _round(self.plan.imbalance_after),
            "irqbalance": self.irqbalance.to_json(), "guidance": self.guidance,
            "notes": list(self.notes), "events": list(self.events),
            "per_cpu_irqs": {str(cpu): n for cpu, n in sorted(self.per_cpu_irqs.items())},
            "failures": self.failures,
            "irqs": entries,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@record
class View:
    """What other threads read: replaced whole at the end of every call, never mutated."""

    full: CycleReport | None = None  # the last full cycle
    last: CycleReport | None = None  # the last call, full or re-plan
    entries: dict[int, PlanEntry] = field(default_factory=dict)  # re-planned since the full cycle
    status: dict[int, str] = field(default_factory=dict)
    cycles: int = 0
    replans: int = 0
    moves_total: int = 0
    failures: dict[str, object] = field(default_factory=dict)
    managed: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # errno -> IRQs refused for good (not managed)
    retrying: int = 0


def near_device(topology: Topology, address: str | None, cpus: tuple[int, ...] | None) -> bool | None:
    device = topology.device(address) if address else None
    if device is None or not cpus:
        return None
    near = set(device.local_cpus)
    node = topology.node(device.numa_node) if device.numa_node is not None else None
    if not near and node is not None:
        near = set(node.cpus)
    return set(cpus) <= near if near else None


def per_cpu(entries: Iterable[PlanEntry]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for entry in entries:
        if entry.policy == "spread" and entry.planned and len(entry.planned) == 1:
            counts[entry.planned[0]] = counts.get(entry.planned[0], 0) + 1
    return counts
