"""One IRQ balancing cycle: read -> classify -> plan -> apply -> report.

IrqBalancer holds what must survive between cycles: the previous counters (for rates),
per-IRQ cooldowns (after a move), the failures (failures.py: managed and refused IRQs,
retries with backoff, a /proc/irq that takes no write) and the last full cycle's
baseline (baseline.py). The daemon calls `cycle()` every interval and on device or CPU
changes, `replan()` when a lease is granted or released (no /proc scan: only the IRQs
whose candidate CPUs changed are planned and written), publishes the events each report
carries, and serves `report()` (GET /v1/irqs), `health()` (/v1/health) and
`status_text()` (sd_notify STATUS=). Writing a plan and judging each write's outcome
(_carry_out, _record) is the last part of the class.

Threads: cycle(), replan() and configure() are called one at a time (any thread);
report(), health(), status_text() and summary() may be called from another thread at
any moment: they read one immutable view, swapped in whole at the end of each call.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterable, Mapping

from topod.cpulist import format_cpulist
from topod.host import HostRoot
from topod.irq.apply import PERMANENT, REFUSED_HERE_ERRNOS, TRANSIENT, TREE_ERRNOS, WriteOutcome, apply_entry, errno_name
from topod.irq.baseline import Baseline
from topod.irq.classify import IrqInfo, classify_irqs
from topod.irq.coexist import IrqbalanceState, ban_guidance, detect_irqbalance
from topod.irq.failures import Blocked, Failures, Retry, Unsettable
from topod.irq.planner import Plan, PlanEntry, PlanInput, plan_irqs
from topod.irq.procfs import Interrupts, IrqAffinity, Load, measure_load, read_snapshot
from topod.irq.report import CycleReport, View, near_device, per_cpu
from topod.irq.settings import MODES, IrqSettings
from topod.model import Topology
from topod.record import replace

__all__ = ["MODES", "CycleReport", "IrqBalancer"]


class IrqBalancer:
    def __init__(self, host: HostRoot, settings: IrqSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.host = host
        self.settings = settings or IrqSettings()
        self.clock = clock
        self.wall = wall
        self.previous = None  # the last full cycle's Snapshot (counters for rates)
        self.cooldown_until: dict[int, float] = {}
        self.failures = Failures()
        self.last: CycleReport | None = None
        self.last_load: Load | None = None
        self.cycles = 0
        self.replans = 0
        self.moves_total = 0
        self._base: Baseline | None = None
        self._overlay: dict[int, PlanEntry] = {}  # entries re-planned since the last full cycle
        self._overlay_status: dict[int, str] = {}
        self._mode: str | None = None  # the mode of the last call
        self._view = View(failures=self.failures.to_json())
        self._last_plan: tuple[Topology, IrqSettings, PlanInput, Plan] | None = None  # _plan's memo
        self._last_classified: tuple[Topology, list[tuple], dict[int, IrqInfo]] | None = None  # _classify's

    @property
    def unsettable(self) -> dict[int, Unsettable]:
        return self.failures.unsettable

    @property
    def retries(self) -> dict[int, Retry]:
        return self.failures.retries

    def configure(self, settings: IrqSettings) -> None:
        """A reload: new policy from the next call on; cooldowns and per-IRQ failure marks
        stay. Changed settings end a 'writes impossible' verdict (the next cycle tries again)
        and the re-plan baseline (the next re-plan is a full cycle)."""
        if settings != self.settings:
            self.failures.unblock()
            self._base = None
        self.settings = settings

    # -- what the daemon serves (any thread) ---------------------------------------
    def report(self) -> dict[str, object]:
        """GET /v1/irqs: the current plan (the last full cycle with later re-plans laid
        over it), the last call's events, and the failures."""
        view = self._view
        if view.full is None or view.last is None:
            return {"mode": self.settings.mode, "cycles": 0, "replans": 0, "reason": "no cycle has run yet",
                    "failures": view.failures}
        shown = view.full
        if view.entries:
            entries = tuple(view.entries.get(e.irq, e) for e in shown.plan.entries)
            shown = replace(shown, plan=replace(shown.plan, entries=entries),
                            status={**shown.status, **view.status}, per_cpu_irqs=per_cpu(entries))
        body = shown.to_json()
        last = view.last
        body.update(kind=last.kind, time=last.time, applied=last.applied, moves=last.moves,
                    events=list(last.events), failures=view.failures, cycles=view.cycles,
                    replans=view.replans, moves_total=view.moves_total)
        if last.kind == "replan":
            body["replan_notes"] = list(last.notes)
        return body

    def health(self) -> dict[str, object]:
        """For /v1/health: small, and enough to see that IRQ balancing does or cannot work."""
        view = self._view
        return {"mode": self.settings.mode, "cycles": view.cycles, "replans": view.replans,
                "moves_total": view.moves_total, "unsettable": view.failures.get("permanent", 0),
                "writable": view.failures.get("writable", True), "last_error": view.failures.get("last_error")}

    def status_text(self) -> str:
        """One line for sd_notify STATUS= and `topoctl status`, e.g. 'IRQ cycle 4
        (continuous), 0 move(s), 105 IRQ(s) unsettable: /proc/irq read-only (EROFS)'."""
        view = self._view
        last = view.last
        if last is None:
            return f"IRQ balancing ({self.settings.mode}): no cycle yet"
        if last.mode == "off":
            return f"IRQ balancing off (cycle {view.cycles})"
        held = ", yielding to irqbalance" if last.irqbalance.running and not last.applied else ""
        text = f"IRQ cycle {view.cycles} ({last.mode}{held}), {last.moves} move(s)"
        if view.replans:
            text += f", {view.replans} re-plan(s)"
        failures = view.failures
        if not failures.get("writable", True):
            text += f", {failures['permanent']} IRQ(s) unsettable: {failures['reason']}"
        else:
            if view.managed:
                text += f", {view.managed} kernel-managed"
            if view.refused:
                text += f", {sum(view.refused.values())} refused (" + ", ".join(sorted(view.refused)) + ")"
        if view.retrying:
            text += f", {view.retrying} retrying"
        return text

    def summary(self) -> str:
        return self.status_text()

    # -- the work (one call at a time) ---------------------------------------------
    def cycle(self, topology: Topology, leased_cpus: Iterable[int] = (), *, mode: str | None = None) -> CycleReport:
        """A full cycle: read /proc, classify, plan every IRQ, apply, report."""
        mode = mode or self.settings.mode
        if mode not in MODES:
            raise ValueError(f"IRQ mode {mode!r} is not one of {', '.join(MODES)}")
        self.cycles += 1
        if self._mode is not None and mode != self._mode:
            self.failures.unblock()  # another mode: try writing again
        self._mode = mode
        self._overlay, self._overlay_status = {}, {}
        if mode == "off":
            self._base = None
            self.failures.unwritten.clear()
            report = CycleReport("off", self.wall(), False, Plan(()), {}, (), 0, IrqbalanceState(False, ()),
                                 ("IRQ balancing is off (irq.mode = \"off\")",))
            return self._publish(report, full=True)
        now = self.clock()
        snapshot = read_snapshot(self.host, now, self.previous)
        load, no_rate = measure_load(self.previous, snapshot)
        self.last_load = load  # for the daemon's per-CPU interrupt-rate metrics
        self.previous = snapshot
        irqs = self._classify(topology, snapshot.interrupts)
        self._forget_vanished(irqs)
        leased = frozenset(leased_cpus)
        # Kept current with every write from here on; the next snapshot keeps the entries
        # of IRQs that stayed quiet from it (read_affinities).
        affinity = snapshot.affinity
        plan = self._plan(topology, irqs, affinity, load, leased, now)
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
        held = irqbalance.running and not may_write
        status, events = self._carry_out(plan, topology, may_write, now, held, affinity, probe=True)
        if any(e["event"] == "irq_unsettable" for e in events):
            # The kernel just refused some IRQs for good: plan the rest again without them,
            # in this same cycle, so the counts stay even among the CPUs topod does move.
            plan = self._plan(topology, irqs, affinity, load, leased, now)
            again, more = self._carry_out(plan, topology, may_write, now, False, affinity, probe=False)
            status = {irq: now_ if now_ != "unchanged" else status.get(irq, now_) for irq, now_ in again.items()}
            events += more
        self.failures.unwritten = {irq for irq, s in status.items() if s == "unwritable"}
        if self.failures.blocked is not None and may_write:
            notes.append(f"IRQ WRITES IMPOSSIBLE: {self.failures.blocked.reason}; "
                         f"{len(self.failures.unwritten)} planned change(s) not written")
        moves = sum(1 for e in events if e["event"] == "irq_moved")
        report = CycleReport(mode, self.wall(), may_write, plan, status, tuple(events), moves, irqbalance,
                             tuple(notes), guidance, load is not None,
                             no_rate is not None and "CPU columns" in no_rate, per_cpu(plan.entries))
        self._base = Baseline.build(topology, self.settings, mode, may_write, held, leased, irqs, affinity, load,
                                    plan.background, self._base)
        return self._publish(report, full=True)

    def replan(self, topology: Topology, leased_cpus: Iterable[int] = ()) -> CycleReport:
        """After a lease is granted or released: plan and write only the IRQs whose candidate
        CPUs changed (and the spread groups they share), from the last full cycle's
        baseline, without reading /proc. The report lists only those IRQs. Falls back to a
        full cycle when there is no baseline, or the topology, settings or mode changed."""
        base = self._base
        mode = self.settings.mode
        if base is None or mode != base.mode or self.settings is not base.settings \
                or (topology is not base.topology and topology != base.topology):
            return self.cycle(topology, leased_cpus)
        self.replans += 1
        now = self.clock()
        leased = frozenset(leased_cpus)
        changed_cpus = len(base.leased ^ leased)
        todo, pools = base.lease_change(leased)
        irqs = {irq: base.irqs[irq] for irq in todo}
        plan = self._plan(topology, irqs, base.affinity, base.load, leased, now, base.background)
        status, events = self._carry_out(plan, topology, base.may_write, now, base.held, base.affinity,
                                         probe=False)
        if any(e["event"] == "irq_unsettable" for e in events):
            plan = self._plan(topology, irqs, base.affinity, base.load, leased, now, base.background)
            again, more = self._carry_out(plan, topology, base.may_write, now, False, base.affinity, probe=False)
            status = {irq: now_ if now_ != "unchanged" else status.get(irq, now_) for irq, now_ in again.items()}
            events += more
        for irq, state in status.items():
            (self.failures.unwritten.add if state == "unwritable" else self.failures.unwritten.discard)(irq)
        for entry in plan.entries:
            self._overlay[entry.irq] = entry
        self._overlay_status.update(status)
        moves = sum(1 for e in events if e["event"] == "irq_moved")
        notes = (f"re-plan after a lease change: {changed_cpus} CPU(s) changed lease state, {pools} device(s) "
                 f"with new candidate CPUs, {len(irqs)} IRQ(s) re-planned, nothing else read or written",)
        irqbalance = self._view.full.irqbalance if self._view.full else IrqbalanceState(False, ())
        report = CycleReport(mode, self.wall(), base.may_write, plan, status, tuple(events), moves, irqbalance,
                             notes, None, base.load is not None, False, per_cpu(plan.entries), kind="replan")
        return self._publish(report, full=False)

    def _publish(self, report: CycleReport, *, full: bool) -> CycleReport:
        self.moves_total += report.moves
        failures = self.failures.to_json()
        report = replace(report, failures=failures)
        self.last = report
        refused: dict[str, int] = {}
        for mark in self.failures.unsettable.values():
            if not mark.managed:
                refused[errno_name(mark.errno)] = refused.get(errno_name(mark.errno), 0) + 1
        previous = self._view
        self._view = View(report if full else previous.full, report, dict(self._overlay), dict(self._overlay_status),
                           self.cycles, self.replans, self.moves_total, failures,
                           sum(1 for mark in self.failures.unsettable.values() if mark.managed), refused,
                           len(self.failures.retries))
        return report

    def _classify(self, topology: Topology, interrupts: Interrupts) -> dict[int, IrqInfo]:
        """classify_irqs, or the last cycle's answer when the lines name the same vectors
        (counts aside: a class depends on the IRQ, chip, hwirq and name, and the topology)."""
        vectors = [(line.irq, line.chip, line.hwirq, line.name) for line in interrupts.lines.values()]
        last = self._last_classified
        if last is not None and last[0] is topology and last[1] == vectors:
            return last[2]
        irqs = classify_irqs(topology, interrupts)
        self._last_classified = (topology, vectors, irqs)
        return irqs

    def _plan(self, topology: Topology, irqs: Mapping[int, IrqInfo], affinity: Mapping[int, IrqAffinity],
              load: Load | None, leased: frozenset[int], now: float,
              background: Mapping[int, float] | None = None) -> Plan:
        inputs = PlanInput(
            irqs=irqs,
            current={irq: affinity[irq].requested if irq in affinity else None for irq in irqs},
            effective={irq: affinity[irq].effective if irq in affinity else None for irq in irqs},
            leased_cpus=leased,
            weights=load.weight if load else None,
            unsettable={irq: self._unsettable_reason(topology, info, affinity)
                        for irq, info in irqs.items() if irq in self.failures.unsettable},
            cooling=frozenset(irq for irq in irqs if self.cooldown_until.get(irq, 0.0) > now),
            background=background if load else None,
        )
        # The plan is a pure function of these: a cycle on a quiet host (no IRQ moved, no
        # rate changed, no lease or cooldown ended) reuses the last one instead of planning
        # every IRQ again; comparing the inputs costs a fraction of that.
        last = self._last_plan
        if last is not None and last[0] is topology and last[1] is self.settings and last[2] == inputs \
                and list(last[2].irqs) == list(inputs.irqs):  # the same order too: plan_irqs walks it
            return last[3]
        plan = plan_irqs(topology, inputs, self.settings)
        self._last_plan = (topology, self.settings, inputs, plan)
        return plan

    # -- state --------------------------------------------------------------------
    def _forget_vanished(self, irqs: Mapping[int, IrqInfo]) -> None:
        """An IRQ number that disappeared, or now names another vector, is a new IRQ."""
        failures = self.failures
        gone = [irq for table in (failures.unsettable, failures.retries) for irq, mark in table.items()
                if irq not in irqs or irqs[irq].name != mark.name]
        failures.forget(gone)
        for irq in [irq for irq in self.cooldown_until if irq not in irqs]:
            del self.cooldown_until[irq]

    def _unsettable_reason(self, topology: Topology, info: IrqInfo, affinity: Mapping[int, IrqAffinity]) -> str:
        mark = self.failures.unsettable[info.irq]
        current = affinity.get(info.irq)
        effective = current.delivered if current else None
        near = near_device(topology, info.device, effective)
        where = "unknown CPUs" if effective is None else f"CPU {format_cpulist(effective)}"
        locality = {True: "near the device", False: "NOT near the device", None: "locality unknown"}[near]
        what = ("kernel-managed or not settable" if mark.managed else
                "refused by topod's write checks" if mark.errno in REFUSED_HERE_ERRNOS else "refused by the kernel")
        return f"{what} ({errno_name(mark.errno)}); the kernel delivers it on {where}, {locality}; never retried"

    # -- carrying a plan out: which planned changes are written now (not while yielding or
    # in dry-run, not before an IRQ's retry is due, one probe while /proc/irq takes no
    # write), and what each write's outcome makes of the failures, cooldowns and events
    # (apply.py writes one entry; irqbalance keeps activate.c apart from placement.c the same way)
    def _carry_out(self, plan: Plan, topology: Topology, may_write: bool, now: float, yielded: bool,
                   affinity: dict[int, IrqAffinity], *, probe: bool) -> tuple[dict[int, str], list[dict[str, object]]]:
        """Write what changes. While /proc/irq takes no write, a full cycle (probe=True)
        tries one write to find out whether it does again (each IRQ in turn, so a verdict
        drawn from a few IRQs cannot hold the others back for good); nothing else is attempted."""
        failures = self.failures
        status: dict[int, str] = {}
        events: list[dict[str, object]] = []
        refused: list[tuple[PlanEntry, WriteOutcome]] = []  # permanent, not managed: judged at the end
        attempted = 0
        blocked_now: PlanEntry | None = None
        for entry in plan.entries:
            if entry.managed:
                mark = failures.unsettable.get(entry.irq)
                status[entry.irq] = "refused" if mark is not None and not mark.managed else "managed"
                continue
            if not entry.changes:
                status[entry.irq] = "unchanged"
                continue
            if not may_write:
                status[entry.irq] = "held" if yielded else "planned"
                continue
            retry = failures.retries.get(entry.irq)
            if retry is not None and retry.next_at > now:
                status[entry.irq] = "retrying"
                continue
            blocked = failures.blocked
            if blocked is not None and (not probe or entry.irq <= failures.last_probe):
                status[entry.irq] = "unwritable"
                continue
            if blocked is not None:
                failures.last_probe = entry.irq  # the next probe tries the next IRQ, in turn
            probe = False
            outcome = apply_entry(self.host, entry)
            if outcome is None:
                status[entry.irq] = "unchanged"
                continue
            if blocked is not None:
                if outcome.status == PERMANENT and outcome.errno == blocked.errno:
                    status[entry.irq] = "unwritable"  # still: say nothing, try again next full cycle
                    if blocked.refused:
                        blocked.refused[entry.irq] = entry.name
                    continue
                failures.unblock()
                events.append({"event": "irq_writes_possible", "irq": entry.irq, "errno": None,
                               "reason": f"a write under /proc/irq was taken again (was: {blocked.reason})"})
                self._refused_after_all(blocked, events)
            attempted += 1
            if outcome.written is not None:
                affinity[entry.irq] = IrqAffinity(outcome.written, outcome.effective,
                                                  affinity[entry.irq].node if entry.irq in affinity else None)
            if outcome.status == PERMANENT and not outcome.managed:
                if outcome.errno in TREE_ERRNOS:
                    failures.block(outcome.errno or 0, self.wall(), self._mode or self.settings.mode)
                    blocked_now = entry
                    status[entry.irq] = "unwritable"
                    continue
                refused.append((entry, outcome))
                status[entry.irq] = "refused"
                continue
            status[entry.irq] = self._record(entry, outcome, topology, now, events)
        if probe and failures.blocked is not None:
            failures.last_probe = -1  # every IRQ had its turn: start again from the first
        codes = {outcome.errno for _, outcome in refused}
        if blocked_now is None and len(refused) >= 2 and len(refused) == attempted and len(codes) == 1:
            # Every write of this call failed alike: the tree, not the IRQs, refuses.
            failures.block(codes.pop() or 0, self.wall(), self._mode or self.settings.mode,
                           {entry.irq: entry.name for entry, _ in refused})
            blocked_now = refused[0][0]
            for entry, _ in refused:
                status[entry.irq] = "unwritable"
            refused = []
        for entry, outcome in refused:
            status[entry.irq] = self._record(entry, outcome, topology, now, events)
        if blocked_now is not None and failures.blocked is not None:
            count = sum(1 for state in status.values() if state == "unwritable")
            events.append({"event": "irq_writes_impossible", "irq": blocked_now.irq,
                           "errno": errno_name(failures.blocked.errno), "unwritable": count,
                           "reason": failures.last_error})
        return status, events

    def _refused_after_all(self, blocked: Blocked, events: list[dict[str, object]]) -> None:
        """A write was taken again after every write had failed alike: the IRQs that failed
        are refused one by one (marked and announced once), not the whole tree."""
        for irq, name in blocked.refused.items():
            self.failures.unsettable[irq] = Unsettable(name, blocked.errno)
            events.append({"event": "irq_unsettable", "irq": irq, "device": None, "name": name,
                           "errno": errno_name(blocked.errno), "effective": None, "near_device": None,
                           "reason": f"the kernel refused the write ({errno_name(blocked.errno)}) while other IRQs "
                                     "took theirs; never retried"})

    def _record(self, entry: PlanEntry, outcome: WriteOutcome, topology: Topology, now: float,
                events: list[dict[str, object]]) -> str:
        failures = self.failures
        if outcome.changed:
            failures.retries.pop(entry.irq, None)
            self.cooldown_until[entry.irq] = now + self.settings.cooldown_seconds
            reason = entry.reason + (f" ({outcome.message})" if outcome.message else "")
            events.append({"event": "irq_moved", "irq": entry.irq, "device": entry.device, "name": entry.name,
                           "from": list(entry.current or ()), "to": list(outcome.written or ()), "reason": reason})
            return outcome.status
        what = f"IRQ {entry.irq}" + (f" ({entry.name})" if entry.name else "")
        if outcome.status == PERMANENT:
            failures.unsettable[entry.irq] = Unsettable(entry.name, outcome.errno or errno.EIO)
            failures.retries.pop(entry.irq, None)
            near = near_device(topology, entry.device, outcome.effective)
            why = "kernel-managed or not settable" if outcome.managed else outcome.message if outcome.refused_here \
                else f"the kernel refused the write ({outcome.errno_name}), an answer that is not transient"
            failures.last_error = f"{what}: {why}"
            # Announced once: the mark keeps it out of every later plan and write.
            events.append({"event": "irq_unsettable", "irq": entry.irq, "device": entry.device, "name": entry.name,
                           "errno": outcome.errno_name, "effective": list(outcome.effective or ()),
                           "near_device": near, "reason": f"{why}; never retried"})
            return "managed" if outcome.managed else "refused"
        attempts = (failures.retries[entry.irq].attempts if entry.irq in failures.retries else 0) + 1
        delay = min(self.settings.retry_base_seconds * 2 ** (attempts - 1), self.settings.retry_max_seconds)
        failures.retries[entry.irq] = Retry(entry.name, attempts, now + delay, outcome.errno)
        failures.last_error = f"{what}: {outcome.message}"
        events.append({"event": "irq_move_failed", "irq": entry.irq, "device": entry.device, "name": entry.name,
                       "errno": outcome.errno_name, "attempt": attempts, "retry_in_seconds": delay,
                       "reason": outcome.message})
        return "failed" if outcome.status == TRANSIENT else outcome.status
