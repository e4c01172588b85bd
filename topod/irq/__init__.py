"""The IRQ balancer: read /proc, classify, plan (pure), apply, report.

The daemon holds one IrqBalancer: `cycle(topology, leased_cpus)` on its interval,
`replan(topology, leased_cpus)` on a lease change, `report()` / `health()` /
`status_text()` for the API and systemd; everything else here is the pieces it is made
of, each usable alone (the CLI and tests do).

The names below are loaded on first use: the daemon imports topod.irq.settings (its
configuration schema) but runs the balancer in the IRQ worker process, so importing the
package must not load the whole pipeline into the daemon (~1 MiB of memory).
"""

from __future__ import annotations

import importlib

_WHERE = {
    "CycleReport": "cycle", "IrqBalancer": "cycle",
    "Plan": "planner", "PlanEntry": "planner", "PlanInput": "planner", "plan_irqs": "planner",
    "DEFAULT_POLICY": "settings", "DEFAULTS": "settings", "IRQBALANCE_CHOICES": "settings", "MODES": "settings",
    "POLICIES": "settings", "IrqSettings": "settings",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):  # noqa: ANN202 - PEP 562: the module attribute, loaded now
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'topod.irq' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"topod.irq.{module}"), name)
    globals()[name] = value
    return value
