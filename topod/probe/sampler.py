"""When to probe, and which links: an adaptive schedule under a hard time budget.

* The interval doubles (`backoff`) after every stable cycle, up to `max_interval_s`.
* It drops to `min_interval_s` on a lease change, a topology change or a deviation
  (a cycle whose results moved, or a link that changed state): those are the moments the
  seed says traffic patterns change.
* Probe time never exceeds `budget_share` of wall time: each interval is at least the
  last cycle's cost / budget_share, and a probe is never due before the cumulative
  probe time since start would fit the budget.
* Links touching a GPU held by a lease are skipped unless `probe_leased_gpus`: a probe
  would steal the job's bandwidth and measure the job, not the link.

The schedule is pure (callers pass `now`); `run_cycle` is the thin shell the daemon runs
in a worker thread (backends block while they copy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from topod.probe.backend import LinkId, ProbeBackend, ProbeResult, ProbeUnavailable
from topod.probe.linkstate import CycleSummary, LinkState


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    enabled: bool = True
    min_interval_s: float = 30.0
    max_interval_s: float = 3600.0
    backoff: float = 2.0
    budget_share: float = 0.01
    probe_leased_gpus: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise ValueError("probe intervals: need 0 < min_interval_seconds <= max_interval_seconds")
        if not 0 < self.budget_share <= 1:
            raise ValueError(f"probe.budget_share must be in (0, 1], got {self.budget_share}")
        if self.backoff < 1:
            raise ValueError(f"probe backoff must be >= 1, got {self.backoff}")


@dataclass(frozen=True, slots=True)
class Plan:
    links: tuple[LinkId, ...]
    skipped: tuple[tuple[LinkId, str], ...]


@dataclass(slots=True)
class Sampler:
    settings: SamplerSettings
    started: float
    interval: float = field(init=False)
    next_due: float = field(init=False)
    spent_s: float = 0.0
    bytes_total: int = 0
    cycles: int = 0
    last_cost_s: float = 0.0
    last_end: float | None = None
    last_reason: str = "start"

    def __post_init__(self) -> None:
        self.interval = self.settings.min_interval_s
        self.next_due = self.started  # measure once at start: discovery needs checking

    def budget_floor(self, cost_s: float) -> float:
        """The shortest interval at which a cycle of cost_s stays inside the budget."""
        return cost_s / self.settings.budget_share

    def due_at(self) -> float:
        # Never before the cumulative probe time fits the budget share of wall time.
        return max(self.next_due, self.started + self.spent_s / self.settings.budget_share)

    def due(self, now: float) -> bool:
        return self.settings.enabled and now >= self.due_at()

    def seconds_until_due(self, now: float) -> float:
        return max(0.0, self.due_at() - now)

    def plan(self, links: Iterable[LinkId], leased_devices: Iterable[str] = ()) -> Plan:
        """The links to probe now; leased_devices are PCI addresses of leased GPUs."""
        leased = set(leased_devices)
        chosen, skipped = [], []
        for link in links:
            held = {link.src, link.dst} & leased
            if held and not self.settings.probe_leased_gpus:
                skipped.append((link, f"{', '.join(sorted(held))} held by a lease"))
            else:
                chosen.append(link)
        return Plan(tuple(chosen), tuple(skipped))

    def record(self, cost_s: float, bytes_moved: int, stable: bool, now: float) -> float:
        """Account a finished cycle; returns the next interval."""
        self.spent_s += cost_s
        self.bytes_total += bytes_moved
        self.cycles += 1
        self.last_cost_s = cost_s
        self.last_end = now
        if stable:
            self.interval = min(self.settings.max_interval_s, self.interval * self.settings.backoff)
            self.last_reason = "stable"
        else:
            self.interval = self.settings.min_interval_s
            self.last_reason = "deviation" if self.cycles > 1 else "first cycle"
        self.interval = max(self.interval, self.budget_floor(cost_s))
        self.next_due = now + self.interval
        return self.interval

    def reset(self, reason: str, now: float) -> None:
        """Back to the minimum interval: lease change, topology change, deviation."""
        self.interval = max(self.settings.min_interval_s, self.budget_floor(self.last_cost_s))
        anchor = self.last_end if self.last_end is not None else now
        self.next_due = min(self.next_due, max(now, anchor + self.interval))
        self.last_reason = reason

    def on_lease_change(self, now: float) -> None:
        self.reset("lease_change", now)

    def on_topology_change(self, now: float) -> None:
        self.reset("topology_change", now)

    def share(self, now: float) -> float:
        """Probe time as a share of wall time since the sampler started."""
        elapsed = now - self.started
        return self.spent_s / elapsed if elapsed > 0 else 0.0

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "enabled": self.settings.enabled,
            "interval_s": round(self.interval, 3),
            "next_in_s": round(self.seconds_until_due(now), 3),
            "last_reason": self.last_reason,
            "cycles": self.cycles,
            "probe_seconds": round(self.spent_s, 6),
            "probe_bytes": self.bytes_total,
            "share_of_wall_time": round(self.share(now), 6),
            "budget_share": self.settings.budget_share,
        }


@dataclass(frozen=True, slots=True)
class CycleReport:
    results: tuple[ProbeResult, ...]
    skipped: tuple[tuple[LinkId, str], ...]  # leased, or unavailable (with the reason)
    summary: CycleSummary
    interval_s: float


def run_cycle(backend: ProbeBackend, state: LinkState, sampler: Sampler, leased_devices: Iterable[str] = (),
              clock: Callable[[], float] = time.time) -> CycleReport:
    """One probe cycle: plan, measure, fold, reschedule. Blocking; run it off the loop."""
    plan = sampler.plan(state.links, leased_devices)
    results, skipped = [], list(plan.skipped)
    started = time.perf_counter()
    for link in plan.links:
        try:
            results.append(backend.measure(link))
        except ProbeUnavailable as exc:
            skipped.append((link, str(exc)))
    summary = state.fold_cycle(results)
    # Wall time of the whole cycle (setup and failures too), or the backend's own figure
    # when it reports more (the simulated backend's transfers take no real time).
    cost = max(time.perf_counter() - started, summary.seconds)
    interval = sampler.record(cost, summary.bytes_moved, summary.stable, clock())
    return CycleReport(tuple(results), tuple(skipped), summary, interval)
