"""The writes of one IRQ cycle or re-plan (a mixin of topod.irq.cycle.IrqBalancer):
which planned changes are written now (not while yielding or in dry-run, not before an
IRQ's retry is due, one probe while /proc/irq takes no write), and what each write's
outcome makes of the failure state, the cooldowns and the events. Its own module because
carrying a plan out is a step apart from reading and planning (as irqbalance keeps
activate.c apart from placement.c); apply.py does the write of one entry, and what these
methods read and mutate is the balancer's (host, settings, failures, cooldown_until, wall,
_mode).
"""

from __future__ import annotations

import errno

from topod.irq.apply import PERMANENT, TRANSIENT, TREE_ERRNOS, WriteOutcome, apply_entry, errno_name
from topod.irq.failures import Blocked, Retry, Unsettable
from topod.irq.planner import Plan, PlanEntry
from topod.irq.procfs import IrqAffinity
from topod.irq.report import near_device
from topod.model import Topology


class CycleWrites:
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
