"""The IRQ balancer: read /proc, classify, plan (pure), apply, report.

The daemon holds one IrqBalancer and calls `cycle(topology, leased_cpus)`; everything
else here is the pieces it is made of, each usable alone (the CLI and tests do).
"""

from __future__ import annotations

from topod.irq.cycle import CycleReport, IrqBalancer
from topod.irq.planner import Plan, PlanEntry, PlanInput, plan_irqs
from topod.irq.settings import DEFAULT_POLICY, POLICIES, IrqSettings

__all__ = ["CycleReport", "DEFAULT_POLICY", "IrqBalancer", "IrqSettings", "POLICIES", "Plan", "PlanEntry",
           "PlanInput", "plan_irqs"]
