"""Link validation inside the daemon: adaptive probe cycles off the event loop, job
telemetry, and the corrections that make allocation prefer healthy links."""

from __future__ import annotations

import asyncio
import time

import structlog

from topod.errors import ConfigError

log = structlog.get_logger("topod")
IDLE_RECHECK_SECONDS = 600.0


class ProbeTask:
    def __init__(self, daemon) -> None:
        from topod.probe.backend import ProbeUnavailable
        from topod.probe.registry import open_backend
        from topod.probe.linkstate import LinkState
        from topod.probe.sampler import Sampler, SamplerSettings

        self.daemon = daemon
        section = daemon.config.section("probe")
        spec = section["backend"]
        if spec == "simulated":
            spec = f"simulated:{section['simulated_table']}"
        self.disabled: str | None = None
        self.backend = None
        try:
            self.backend = open_backend(spec, daemon.topology)
        except (ProbeUnavailable, ConfigError, OSError) as exc:
            self.disabled = f"probe backend {spec!r} unavailable: {exc}"
            log.warning("probe_disabled", reason=self.disabled)
        self.state = LinkState(self.backend.links() if self.backend else ())
        self.sampler = Sampler(SamplerSettings(
            min_interval_s=section["min_interval_seconds"], max_interval_s=section["max_interval_seconds"],
            budget_share=section["budget_share"], probe_leased_gpus=section["probe_leased_gpus"]),
            started=time.time())
        self.findings: tuple = ()

    def _gpu_addresses(self) -> dict[int, str]:
        return {gpu.index: gpu.address for gpu in self.daemon.topology.gpus}

    def _leased_addresses(self) -> list[str]:
        addresses = self._gpu_addresses()
        return [addresses[g] for g in self.daemon.alloc.leased_gpus() if g in addresses]

    async def step(self) -> float:
        """One cycle when due; returns the seconds until the next check."""
        from topod.probe.sampler import run_cycle

        if self.backend is None:
            return IDLE_RECHECK_SECONDS
        now = time.time()
        if self.sampler.due(now):
            report = await asyncio.to_thread(run_cycle, self.backend, self.state, self.sampler,
                                             self._leased_addresses())
            for event in report.summary.events:
                self.daemon.bus.publish(event.event, **event.fields())
            self._apply()
        return max(1.0, self.sampler.seconds_until_due(time.time()))

    def _apply(self) -> None:
        from topod.probe.calibrate import calibrate

        calibration = calibrate(self.daemon.discovered, self.state.measurements())
        self.findings = calibration.findings
        self.daemon.topology = calibration.topology
        self.daemon.alloc.set_topology(calibration.topology)
        self.daemon.alloc.set_corrections(self.state.corrections())

    def report(self) -> dict:
        from topod.probe.linkstate import links_document

        now = time.time()
        doc = links_document(self.state, self.daemon.topology, now, self.findings, sampler=self.sampler.to_json(now))
        doc["enabled"] = self.backend is not None
        if self.disabled:
            doc["reason"] = self.disabled
        return doc

    def telemetry(self, body) -> dict:
        outcome = self.state.telemetry_body(body, time.time(), self._gpu_addresses())
        for event in outcome.events:
            self.daemon.bus.publish(event.event, **event.fields())
        if outcome.folded:
            self.daemon.alloc.set_corrections(self.state.corrections())
        return {"link": str(outcome.link), "bandwidth_gbps": outcome.bandwidth_gbps, "folded": outcome.folded,
                "reason": outcome.reason}

    def leases_changed(self) -> None:
        self.sampler.on_lease_change(time.time())

    def topology_changed(self) -> None:
        self.sampler.on_topology_change(time.time())
        if self.backend is not None:
            self.state.register(self.backend.links())
