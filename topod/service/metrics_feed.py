"""The daemon's state as one metrics snapshot (topod.export.metrics renders it)."""

from __future__ import annotations

import time

from topod import __version__


def metrics_snapshot(daemon) -> dict:
    alloc = daemon.alloc
    leased = alloc.leased_gpus()
    total = len(daemon.topology.gpus)
    snapshot = {
        "build": {"version": __version__},
        "gpus_by_state": {"free": total - len(leased), "leased": len(leased)},
        "leases": [{"id": lease.id, "gpus": len(lease.gpus), "cpus": len(lease.cpus),
                    "satisfaction": lease.decision.satisfaction} for lease in alloc.leases()],
        "gpu_leased": {gpu.index: int(gpu.index in leased) for gpu in daemon.topology.gpus},
        "decision_latency": alloc.decision_latency.to_snapshot(),
        "requests": [{"result": result, "reason": reason, "count": count}
                     for (result, reason), count in sorted(alloc.outcomes.items())],
    }
    quotas = alloc.quotas
    caps = ([{"scope": "uid", "group": "", "cap": quotas.per_uid}] if quotas.per_uid is not None else []) + \
        [{"scope": "group", "group": cap.name, "cap": cap.cap} for cap in quotas.groups]
    if caps:
        snapshot["gpu_caps"] = caps
    if daemon.topology.devices_of_kind("rdma"):
        from topod.alloc.nics import nic_ports_by_state

        snapshot["nics_by_state"] = nic_ports_by_state(daemon.topology, alloc.leased_nics())
    if daemon.topology.gpus:
        snapshot["gpu_info"] = [{"index": gpu.index, "address": gpu.address, "vendor": gpu.vendor, "model": gpu.model}
                                for gpu in daemon.topology.gpus]
    from topod.discover.fabric import nvlink_domain

    domain = nvlink_domain(daemon.topology.gpus)
    if domain is not None:
        snapshot["nvlink_domain"] = domain
    if daemon.irq is not None:
        snapshot["irq_moves"] = daemon.irq.moves_total
        if daemon.irq.last is not None:
            snapshot["cpu_interrupt_rates"] = dict(daemon.irq.cpu_rates)
    probe = daemon.probe
    if probe is not None and probe.backend is not None:
        links = []
        # The probe's link table (LinkState) holds the rows; HostState holds only the
        # corrections derived from them.
        for row in probe.links.rows(time.time()):
            if row["measured_gbps"] is None:
                continue
            _, src, dst = str(row["link"]).split("/", 2)
            links.append({"src": src, "dst": dst, "bytes_per_second": float(row["measured_gbps"]) * 1e9})
        snapshot["link_bandwidth"] = links
        if probe.sampler.last_end is not None:
            snapshot["probe"] = {"duration_seconds": probe.sampler.last_cost_s,
                                 "last_timestamp_seconds": probe.sampler.last_end}
    return snapshot


def render_metrics(daemon) -> str:
    from topod.export.metrics import render_metrics as render

    return render(metrics_snapshot(daemon))
