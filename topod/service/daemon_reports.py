"""What the daemon tells about itself: the answers the API serves from it
(topod.api.server.Backend: health and why it is degraded, the topology and lease bodies,
the IRQ and link reports, telemetry, metrics) and the STATUS= line systemd shows. The daemon
(topod.service.daemon) holds a DaemonReports and answers through it. Its own module because
answering is apart from running: the state, loops and tasks these read are the daemon's.
"""

from __future__ import annotations

import time
from typing import Any

from topod import __version__
from topod.errors import UnavailableError
from topod.service.topology_body import TopologyBody
from topod.topojson import topology_to_json

PROBE_STARTING = "link probing is starting (its setup has not finished); try again in a moment"


class DaemonReports:
    """Answers about a running daemon, read from it when asked (its parts change: a reload
    replaces the config, loops start and stop); it keeps one thing of its own, the encoded
    topology body."""

    def __init__(self, daemon: Any) -> None:  # topod.service.daemon.Daemon, which imports this module
        self.daemon = daemon
        self.topology_cache = TopologyBody(
            lambda: (daemon.state.topology, daemon.state.distances, daemon.config.section("cluster")))

    def topology_json(self) -> dict:
        doc = topology_to_json(self.daemon.state.topology, self.daemon.state.distances)
        doc["cluster"] = dict(self.daemon.config.section("cluster"))
        doc["leased_gpus"] = sorted(self.daemon.alloc.leased_gpus())
        return doc

    async def topology_body(self) -> bytes:
        """GET /v1/topology: the encoding of the current topology version, built once in a
        worker thread (TopologyBody), with the leased GPUs of this moment."""
        return await self.topology_cache.body(list(self.daemon.alloc.leased_gpus()))

    def lease_json(self, lease) -> dict:  # noqa: ANN001 - Lease
        return self.daemon.store.json_of(lease)

    def lease_text(self, lease) -> str | None:  # noqa: ANN001 - Lease
        return self.daemon.store.answer_text(lease)

    def degraded(self) -> list[str]:
        """Why the daemon is not fully well, one line each (empty: it is)."""
        now = time.monotonic()
        reasons = [f"loop {name} stalled" for name in self.daemon.supervisor.stalled(now)]
        reasons += [f"loop {name} failing: {error}" for name, error in self.daemon.supervisor.failing().items()]
        if self.daemon.config_error:
            reasons.append(f"config rejected: {self.daemon.config_error}")
        store_problem = self.daemon.store.problem()
        if store_problem:
            reasons.append(store_problem)
        refused = self.daemon.api_gate.refused_recently() if self.daemon.api_gate is not None else None
        if refused:
            reasons.append(refused)
        shortfall = self.daemon.api_gate.shortfall() if self.daemon.api_gate is not None else None
        if shortfall:  # the descriptor limit cannot serve [api] max_connections
            reasons.append(shortfall)
        degraded_leases = [lease.id for lease in self.daemon.alloc.leases() if lease.missing_gpus]
        if degraded_leases:
            reasons.append(f"lease(s) with missing GPUs: {', '.join(degraded_leases)}")
        irq = self.daemon.irq.health() if self.daemon.irq is not None else {}
        if irq.get("writable") is False:
            reasons.append(f"IRQ affinity not writable: {irq.get('last_error')}")
        return reasons

    def health(self) -> dict:
        now = time.monotonic()
        degraded = self.degraded()
        return {
            "status": "degraded" if degraded else "ok",
            "degraded": degraded,
            "version": __version__,
            "root": str(self.daemon.host.root),
            "uptime_seconds": round(time.time() - self.daemon.started, 3),
            "leases": len(self.daemon.alloc.leases()),
            "waiting": len(self.daemon.alloc.waiters),
            "gpus": len(self.daemon.state.topology.gpus),
            "gpus_free": self.daemon.alloc.free_gpus(),
            "config_error": self.daemon.config_error,
            "hotplug": self.daemon.hotplug.to_json() if self.daemon.hotplug is not None else {"active": False, "mode": "starting"},
            "irq": {**(self.daemon.irq.health() if self.daemon.irq is not None else
                       self._irq_starting() if self._setting_up("irq") else {"mode": "off"}),
                    "withheld": self.daemon.irq_withheld},
            "container": self.daemon.container,
            "enforcement": self.daemon.enforcement.to_json(),
            "isolation": self.daemon.isolate.health(),
            "nccl": self.daemon.nccl.health(),
            "scopes": self.daemon.scopes.health(),
            "loops": self.daemon.supervisor.report(now),
            "commits": {"transactions": self.daemon.store.commits, "changes": self.daemon.store.changes,
                        "ledger_rebuilds": self.daemon.store.writer.rebuilds},
        }

    async def irq_report(self) -> dict:
        if self.daemon.irq is None:
            if self._setting_up("irq"):
                return self._irq_starting()
            return {"mode": "off", "reason": "IRQ balancing not enabled ([irq] mode = \"off\")"}
        report = await self.daemon.irq.report()
        if self.daemon.irq_withheld:
            report = {**report, "withheld": self.daemon.irq_withheld}
        return report

    def links_report(self) -> dict:
        if self.daemon.probe is None:
            if self._setting_up("probe"):
                return {"enabled": True, "starting": True, "reason": self._starting_reason("probe", PROBE_STARTING),
                        "links": []}
            return {"enabled": False, "reason": "link probing is disabled ([probe] enabled = false)", "links": []}
        return self.daemon.probe.report()

    def telemetry(self, body: Any, caller: Any = None) -> dict:
        if self.daemon.probe is None:
            if self._setting_up("probe"):
                raise UnavailableError(self._starting_reason("probe", PROBE_STARTING))
            raise UnavailableError("link probing is disabled ([probe] enabled = false)")
        authorize = None if caller is None else self.daemon.alloc.telemetry_authority(caller)
        return self.daemon.probe.telemetry(body, authorize)

    def _irq_starting(self) -> dict:
        return {"mode": self.daemon.irq_section()["mode"], "starting": True,
                "reason": self._starting_reason("irq", "IRQ balancing is starting")}

    def _starting_reason(self, name: str, starting: str) -> str:
        """A setup that keeps failing is retried with backoff: say why, not just 'starting'."""
        error = self.daemon.supervisor.failing().get(name)
        return f"{name} setup failing, retried with backoff: {error}" if error else starting

    def _setting_up(self, name: str) -> bool:
        return self.daemon.setting_up(name)

    def metrics_text(self) -> str:
        from topod.service.metrics_feed import render_metrics

        return render_metrics(self.daemon)

    def status_line(self) -> str:
        total = len(self.daemon.state.topology.gpus)
        parts = [f"{len(self.daemon.alloc.leases())} lease(s)", f"{self.daemon.alloc.free_gpus()}/{total} GPU(s) free"]
        if self.daemon.alloc.waiters:
            parts.append(f"{len(self.daemon.alloc.waiters)} waiting")
        if self.daemon.irq is not None:
            parts.append(self.daemon.irq.status())
        if self.daemon.irq_withheld:
            parts.append(f"IRQ writes withheld: container {self.daemon.container}")
        degraded = self.daemon.supervisor.degraded_text()
        if degraded:
            parts.append(degraded)
        missing = sum(1 for lease in self.daemon.alloc.leases() if lease.missing_gpus)
        if missing:
            parts.append(f"{missing} lease(s) degraded (GPU gone)")
        store_problem = self.daemon.store.problem()
        if store_problem:  # failing writes, a stalled write, a lost database: the store says which
            parts.append(store_problem)
        if self.daemon.config_error:
            parts.append(f"config rejected: {self.daemon.config_error}")
        return "; ".join(parts)
