"""The IRQ balancer: read /proc, classify, plan (pure), apply, report.

The daemon holds one IrqBalancer: `cycle(topology, leased_cpus)` on its interval,
`replan(topology, leased_cpus)` on a lease change, `report()` / `health()` /
`status_text()` for the API and systemd; everything else here is the pieces it is made
of, each usable alone (the CLI and tests do).
"""

from __future__ import annotations

from topod.irq.cycle import CycleReport, IrqBalancer
from topod.irq.planner import Plan, PlanEntry, PlanInput, plan_irqs
from topod.irq.settings import DEFAULT_POLICY, DEFAULTS, IRQBALANCE_CHOICES, MODES, POLICIES, IrqSettings

__all__ = ["CycleReport", "DEFAULT_POLICY", "DEFAULTS", "IRQBALANCE_CHOICES", "IrqBalancer", "IrqSettings", "MODES",
           "POLICIES", "Plan", "PlanEntry", "PlanInput", "plan_irqs"]
