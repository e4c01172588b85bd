"""One IRQ balancing cycle: read -> classify -> plan -> apply -> report.

IrqBalancer holds what must survive between cycles: the previous counters (for rates),
per-IRQ cooldowns (after a move), transient failures (with their backoff) and permanent
ones (managed IRQs: marked, reported, never retried, announced once). The daemon calls
`cycle()` every interval and on lease, device or CPU changes; it publishes the events
the report carries and serves `report()` as GET /v1/irqs.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from topod.cpulist import format_cpulist
from topod.host import HostRoot
from topod.irq.apply import PERMANENT, TRANSIENT, WriteOutcome, apply_entry
from topod.irq.classify import classify_irqs
from topod.irq.coexist import IrqbalanceState, ban_guidance, detect_irqbalance
from topod.irq.planner import Plan, PlanEntry, PlanInput, plan_irqs
from topod.irq.settings import IrqSettings
from topod.irq.procfs import Load, Snapshot, measure_load, read_affinity, read_snapshot
from topod.model import Topology

MODES = ("continuous", "dry-run", "off")


@dataclass(slots=True)
class _Unsettable:
    name: str | None
    errno: int


@dataclass(slots=True)
class _Retry:
    name: str | None
    attempts: int
    next_at: float
    errno: int | None


@dataclass(frozen=True, slots=True)
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
            "mode": self.mode, "time": self.time, "applied": self.applied, "moves": self.moves,
            "rates_measured": self.rates, "rediscover": self.rediscover,
            "imbalance_before": _round(self.plan.imbalance_before), "imbalance_after": _round(self.plan.imbalance_after),
            "irqbalance": self.irqbalance.to_json(), "guidance": self.guidance,
            "notes": list(self.notes), "events": list(self.events),
            "per_cpu_irqs": {str(cpu): n for cpu, n in sorted(self.per_cpu_irqs.items())},
            "irqs": entries,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class IrqBalancer:
    def __init__(self, host: HostRoot, settings: IrqSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.host = host
        self.settings = settings or IrqSettings()
        self.clock = clock
        self.wall = wall
        self.previous: Snapshot | None = None
        self.cooldown_until: dict[int, float] = {}
        self.retries: dict[int, _Retry] = {}
        self.unsettable: dict[int, _Unsettable] = {}
        self.last: CycleReport | None = None
        self.last_load: Load | None = None
        self.cycles = 0

    def configure(self, settings: IrqSettings) -> None:
        """A reload: new policy from the next cycle on; cooldowns and failure marks stay."""
        self.settings = settings

    def report(self) -> dict[str, object]:
        if self.last is None:
            return {"mode": self.settings.mode, "cycles": 0, "reason": "no cycle has run yet"}
        body = self.last.to_json()
        body["cycles"] = self.cycles
        return body

    def summary(self) -> str:
        """One line for sd_notify STATUS and `topoctl status`."""
        if self.last is None:
            return "irq: no cycle yet"
        last = self.last
        held = " (yielding to irqbalance)" if last.irqbalance.running and not last.applied else ""
        return (f"irq {last.mode}{held}: {last.moves} moved last cycle, {len(self.unsettable)} kernel-managed, "
                f"{len(self.retries)} retrying")

    def cycle(self, topology: Topology, leased_cpus: Iterable[int] = (), *, mode: str | None = None) -> CycleReport:
        mode = mode or self.settings.mode
        if mode not in MODES:
            raise ValueError(f"IRQ mode {mode!r} is not one of {', '.join(MODES)}")
        self.cycles += 1
        if mode == "off":
            report = CycleReport("off", self.wall(), False, Plan(()), {}, (), 0, IrqbalanceState(False, ()),
                                 ("IRQ balancing is off (irq.mode = \"off\")",))
            self.last = report
            return report
        now = self.clock()
        snapshot = read_snapshot(self.host, now)
        load, no_rate = measure_load(self.previous, snapshot)
        self.last_load = load  # for the daemon's per-CPU interrupt-rate metrics
        self.previous = snapshot
        irqs = classify_irqs(topology, snapshot.interrupts)
        self._forget_vanished(irqs)
        leased = frozenset(leased_cpus)
        plan = self._plan(topology, irqs, snapshot, load, leased, now)
        notes = list(snapshot.warnings) + list(plan.notes)
        if no_rate:
            notes.append(no_rate)
        irqbalance = detect_irqbalance(self.host)
        may_write, guidance = mode == "continuous", None
        if irqbalance.running:
            if self.settings.irqbalance == "yield":
                may_write = False
                notes.append("IRQBALANCE RUNNING: topod yields (irq.irqbalance = \"yield\") and writes nothing; "
                             f"evidence: {', '.join(irqbalance.evidence)}")
            else:
                notes.append("IRQBALANCE RUNNING: topod balances anyway (irq.irqbalance = \"ban\"); "
                             "ban topod's IRQs in irqbalance (see guidance)")
                managed = [e.irq for e in plan.entries if e.planned is not None]
                keep_clear = leased | set(topology.isolated_cpus) | self.settings.banned_cpus
                guidance = ban_guidance(managed, sorted(keep_clear))
        if mode == "dry-run":
            notes.append("dry-run: planned, nothing written")
        status, events = self._carry_out(plan, topology, may_write, now, irqbalance.running and not may_write)
        if any(e["event"] == "irq_unsettable" for e in events):
            # The kernel just refused some IRQs for good: plan the rest again without them,
            # in this same cycle, so the counts stay even among the CPUs topod does move.
            snapshot = replace(snapshot, affinity={irq: read_affinity(self.host, irq) for irq in snapshot.affinity})
            plan = self._plan(topology, irqs, snapshot, load, leased, now)
            again, more = self._carry_out(plan, topology, may_write, now, False)
            status = {irq: now_ if now_ != "unchanged" else status.get(irq, now_) for irq, now_ in again.items()}
            events += more
        moves = sum(1 for e in events if e["event"] == "irq_moved")
        report = CycleReport(mode, self.wall(), may_write, plan, status, tuple(events), moves, irqbalance,
                             tuple(notes), guidance, load is not None,
                             no_rate is not None and "CPU columns" in no_rate, _per_cpu(plan))
        self.last = report
        return report

    def _plan(self, topology: Topology, irqs: dict, snapshot: Snapshot, load: Load | None, leased: frozenset[int],
              now: float) -> Plan:
        inputs = PlanInput(
            irqs=irqs,
            current={irq: a.requested for irq, a in snapshot.affinity.items()},
            effective={irq: a.effective for irq, a in snapshot.affinity.items()},
            leased_cpus=leased,
            weights=load.weight if load else None,
            unsettable={irq: self._unsettable_reason(topology, irq, snapshot) for irq in self.unsettable},
            cooling=frozenset(irq for irq, until in self.cooldown_until.items() if until > now),
        )
        return plan_irqs(topology, inputs, self.settings)

    # -- applying ---------------------------------------------------------------
    def _carry_out(self, plan: Plan, topology: Topology, may_write: bool, now: float,
                   yielded: bool) -> tuple[dict[int, str], list[dict[str, object]]]:
        status: dict[int, str] = {}
        events: list[dict[str, object]] = []
        for entry in plan.entries:
            if entry.managed:
                status[entry.irq] = "managed"
                continue
            if not entry.changes:
                status[entry.irq] = "unchanged"
                continue
            if not may_write:
                status[entry.irq] = "held" if yielded else "planned"
                continue
            retry = self.retries.get(entry.irq)
            if retry is not None and retry.next_at > now:
                status[entry.irq] = "retrying"
                continue
            outcome = apply_entry(self.host, entry)
            if outcome is None:
                status[entry.irq] = "unchanged"
                continue
            status[entry.irq] = self._record(entry, outcome, topology, now, events)
        return status, events

    def _record(self, entry: PlanEntry, outcome: WriteOutcome, topology: Topology, now: float,
                events: list[dict[str, object]]) -> str:
        if outcome.changed:
            self.retries.pop(entry.irq, None)
            self.cooldown_until[entry.irq] = now + self.settings.cooldown_seconds
            reason = entry.reason + (f" ({outcome.message})" if outcome.message else "")
            events.append({"event": "irq_moved", "irq": entry.irq, "device": entry.device, "name": entry.name,
                           "from": list(entry.current or ()), "to": list(outcome.written or ()), "reason": reason})
            return outcome.status
        if outcome.status == PERMANENT:
            self.unsettable[entry.irq] = _Unsettable(entry.name, outcome.errno or errno.EIO)
            self.retries.pop(entry.irq, None)
            near = _near(topology, entry.device, outcome.effective)
            # Announced once: the mark keeps it out of every later plan and write.
            events.append({"event": "irq_unsettable", "irq": entry.irq, "device": entry.device, "name": entry.name,
                           "errno": outcome.errno_name, "effective": list(outcome.effective or ()),
                           "near_device": near, "reason": "kernel-managed or not settable; never retried"})
            return "managed"
        attempts = (self.retries[entry.irq].attempts if entry.irq in self.retries else 0) + 1
        delay = min(self.settings.retry_base_seconds * 2 ** (attempts - 1), self.settings.retry_max_seconds)
        self.retries[entry.irq] = _Retry(entry.name, attempts, now + delay, outcome.errno)
        events.append({"event": "irq_move_failed", "irq": entry.irq, "device": entry.device, "name": entry.name,
                       "errno": outcome.errno_name, "attempt": attempts, "retry_in_seconds": delay,
                       "reason": outcome.message})
        return "failed" if outcome.status == TRANSIENT else outcome.status

    # -- state --------------------------------------------------------------------
    def _forget_vanished(self, irqs: dict) -> None:
        """An IRQ number that disappeared, or now names another vector, is a new IRQ."""
        for table in (self.unsettable, self.retries):
            for irq in [irq for irq, mark in table.items() if irq not in irqs or irqs[irq].name != mark.name]:
                del table[irq]
        for irq in [irq for irq in self.cooldown_until if irq not in irqs]:
            del self.cooldown_until[irq]

    def _unsettable_reason(self, topology: Topology, irq: int, snapshot: Snapshot) -> str:
        mark = self.unsettable[irq]
        affinity = snapshot.affinity.get(irq)
        effective = affinity.delivered if affinity else None
        device = next((d.address for d in topology.pci_devices if irq in d.msi_irqs), None)
        near = _near(topology, device, effective)
        where = "unknown CPUs" if effective is None else f"CPU {format_cpulist(effective)}"
        locality = {True: "near the device", False: "NOT near the device", None: "locality unknown"}[near]
        return (f"kernel-managed or not settable ({errno.errorcode.get(mark.errno, mark.errno)}); "
                f"the kernel delivers it on {where}, {locality}; never retried")


def _near(topology: Topology, address: str | None, cpus: tuple[int, ...] | None) -> bool | None:
    device = topology.device(address) if address else None
    if device is None or not cpus:
        return None
    near = set(device.local_cpus)
    node = topology.node(device.numa_node) if device.numa_node is not None else None
    if not near and node is not None:
        near = set(node.cpus)
    return set(cpus) <= near if near else None


def _per_cpu(plan: Plan) -> dict[int, int]:
    counts: dict[int, int] = {}
    for entry in plan.entries:
        if entry.policy == "spread" and entry.planned and len(entry.planned) == 1:
            counts[entry.planned[0]] = counts.get(entry.planned[0], 0) + 1
    return counts
