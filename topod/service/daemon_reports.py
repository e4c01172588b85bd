"""What the daemon tells about itself (a mixin of topod.service.daemon.Daemon): the
answers the API serves from it (topod.api.server.Backend: health and why it is degraded,
the topology and lease bodies, the IRQ and link reports, telemetry, metrics) and the
STATUS= line systemd shows. Its own module because answering is apart from running: the
state, loops and tasks these read are topod.service.daemon's and daemon_loops'.
"""

from __future__ import annotations

import time
from typing import Any

from topod import __version__
from topod.errors import UnavailableError
from topod.topojson import topology_to_json

PROBE_STARTING = "link probing is starting (its setup has not finished); try again in a moment"


class DaemonReports:
    def topology_json(self) -> dict:
        doc = topology_to_json(self.state.topology, self.state.distances)
        doc["cluster"] = dict(self.config.section("cluster"))
        doc["leased_gpus"] = sorted(self.alloc.leased_gpus())
        return doc

    async def topology_body(self) -> bytes:
        """GET /v1/topology: the encoding of the current topology version, built once in a
        worker thread (TopologyBody), with the leased GPUs of this moment."""
        return await self._topology_body.body(list(self.alloc.leased_gpus()))

    def lease_json(self, lease) -> dict:  # noqa: ANN001 - Lease
        return self.store.json_of(lease)

    def lease_text(self, lease) -> str | None:  # noqa: ANN001 - Lease
        return self.store.answer_text(lease)

    def degraded(self) -> list[str]:
        """Why the daemon is not fully well, one line each (empty: it is)."""
        now = time.monotonic()
        reasons = [f"loop {name} stalled" for name in self.supervisor.stalled(now)]
        reasons += [f"loop {name} failing: {error}" for name, error in self.supervisor.failing().items()]
        if self.config_error:
            reasons.append(f"config rejected: {self.config_error}")
        store_problem = self.store.problem()
        if store_problem:
            reasons.append(store_problem)
        refused = self.api_gate.refused_recently() if self.api_gate is not None else None
        if refused:
            reasons.append(refused)
        shortfall = self.api_gate.shortfall() if self.api_gate is not None else None
        if shortfall:  # the descriptor limit cannot serve [api] max_connections
            reasons.append(shortfall)
        degraded_leases = [lease.id for lease in self.alloc.leases() if lease.missing_gpus]
        if degraded_leases:
            reasons.append(f"lease(s) with missing GPUs: {', '.join(degraded_leases)}")
        irq = self.irq.health() if self.irq is not None else {}
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
            "root": str(self.host.root),
            "uptime_seconds": round(time.time() - self.started, 3),
            "leases": len(self.alloc.leases()),
            "waiting": len(self.alloc.waiters),
            "gpus": len(self.state.topology.gpus),
            "gpus_free": self.alloc.free_gpus(),
            "config_error": self.config_error,
            "hotplug": self.hotplug.to_json() if self.hotplug is not None else {"active": False, "mode": "starting"},
            "irq": {**(self.irq.health() if self.irq is not None else
                       self._irq_starting() if self._setting_up("irq") else {"mode": "off"}),
                    "withheld": self.irq_withheld},
            "container": self.container,
            "enforcement": self.enforcement.to_json(),
            "isolation": self.isolate.health(),
            "nccl": self.nccl.health(),
            "scopes": self.scopes.health(),
            "loops": self.supervisor.report(now),
            "commits": {"transactions": self.store.commits, "changes": self.store.changes,
                        "ledger_rebuilds": self.store.writer.rebuilds},
        }

    async def irq_report(self) -> dict:
        if self.irq is None:
            if self._setting_up("irq"):
                return self._irq_starting()
            return {"mode": "off", "reason": "IRQ balancing not enabled ([irq] mode = \"off\")"}
        report = await self.irq.report()
        if self.irq_withheld:
            report = {**report, "withheld": self.irq_withheld}
        return report

    def links_report(self) -> dict:
        if self.probe is None:
            if self._setting_up("probe"):
                return {"enabled": True, "starting": True, "reason": self._starting_reason("probe", PROBE_STARTING),
                        "links": []}
            return {"enabled": False, "reason": "link probing is disabled ([probe] enabled = false)", "links": []}
        return self.probe.report()

    def telemetry(self, body: Any, caller: Any = None) -> dict:
        if self.probe is None:
            if self._setting_up("probe"):
                raise UnavailableError(self._starting_reason("probe", PROBE_STARTING))
            raise UnavailableError("link probing is disabled ([probe] enabled = false)")
        authorize = None if caller is None else self.alloc.telemetry_authority(caller)
        return self.probe.telemetry(body, authorize)

    def _irq_starting(self) -> dict:
        return {"mode": self.irq_section()["mode"], "starting": True,
                "reason": self._starting_reason("irq", "IRQ balancing is starting")}

    def _starting_reason(self, name: str, starting: str) -> str:
        """A setup that keeps failing is retried with backoff: say why, not just 'starting'."""
        error = self.supervisor.failing().get(name)
        return f"{name} setup failing, retried with backoff: {error}" if error else starting

    def _setting_up(self, name: str) -> bool:
        """The config wants loop `name` and its setup has not finished (the API answers
        from the moment the socket is bound; a loop's setup may take a moment or retry)."""
        task = self._loops.get(name)
        return task is not None and not task.done()

    def metrics_text(self) -> str:
        from topod.service.metrics_feed import render_metrics

        return render_metrics(self)

    def status_line(self) -> str:
        total = len(self.state.topology.gpus)
        parts = [f"{len(self.alloc.leases())} lease(s)", f"{self.alloc.free_gpus()}/{total} GPU(s) free"]
        if self.alloc.waiters:
            parts.append(f"{len(self.alloc.waiters)} waiting")
        if self.irq is not None:
            parts.append(self.irq.status())
        if self.irq_withheld:
            parts.append(f"IRQ writes withheld: container {self.container}")
        degraded = self.supervisor.degraded_text()
        if degraded:
            parts.append(degraded)
        missing = sum(1 for lease in self.alloc.leases() if lease.missing_gpus)
        if missing:
            parts.append(f"{missing} lease(s) degraded (GPU gone)")
        store_problem = self.store.problem()
        if store_problem:  # failing writes, a stalled write, a lost database: the store says which
            parts.append(store_problem)
        if self.config_error:
            parts.append(f"config rejected: {self.config_error}")
        return "; ".join(parts)
