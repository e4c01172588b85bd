"""The daemon's state as one metrics snapshot (topod.export.metrics renders it)."""

from __future__ import annotations

from topod import __version__


def metrics_snapshot(daemon) -> dict:
    from topod.export.metrics import LatencyHistogram

    alloc = daemon.alloc
    histogram = LatencyHistogram()
    for seconds in alloc.decision_seconds:
        histogram.observe(seconds)
    leased = alloc.leased_gpus()
    total = len(daemon.topology.gpus)
    snapshot = {
        "build": {"version": __version__},
        "gpus_by_state": {"free": total - len(leased), "leased": len(leased)},
        "leases": [{"id": lease.id, "gpus": len(lease.gpus),
                    "satisfaction": float(lease.decision.get("satisfaction", 1.0))} for lease in alloc.leases()],
        "decision_latency": histogram.to_snapshot(),
        "requests_by_result": dict(alloc.results),
    }
    if daemon.irq is not None:
        snapshot["irq_moves"] = daemon.irq.moves_total
    return snapshot


def render_metrics(daemon) -> str:
    from topod.export.metrics import render_metrics as render

    return render(metrics_snapshot(daemon))
