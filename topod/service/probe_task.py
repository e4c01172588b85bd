"""Link validation inside the daemon: adaptive probe cycles in a worker thread, job
telemetry, and the corrections that make allocation prefer healthy links. Results go to
the HostState, which owns the topology they correct."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from topod.errors import ConfigError
from topod.host import HostRoot
from topod.service.state import HostState

log = structlog.get_logger("topod")
IDLE_RECHECK_SECONDS = 600.0
MEASURES_THIS_MACHINE = ("host-memory", "cuda")


def probes_this_root(host: HostRoot, section: dict) -> bool:
    """False where probing would measure another machine than the tree's: a backend that
    measures the machine topod runs on, on a captured tree."""
    return host.is_live or section["backend"] not in MEASURES_THIS_MACHINE


class ProbeTask:
    def __init__(self, host: HostRoot, state: HostState, section: dict, leased_gpus: Callable[[], set[int]],
                 publish: Callable[..., None]) -> None:
        from topod.probe.backend import ProbeUnavailable
        from topod.probe.linkstate import LinkState
        from topod.probe.registry import open_backend
        from topod.probe.sampler import Sampler, SamplerSettings

        self.state = state
        self._leased_gpus = leased_gpus
        self._publish = publish
        spec = section["backend"]
        if spec == "simulated":
            spec = f"simulated:{section['simulated_table']}"
        self.disabled: str | None = None
        self.backend = None
        if not probes_this_root(host, section):
            # A captured tree is another machine: measuring this one would publish lies.
            self.disabled = (f"probe backend {spec!r} measures the machine topod runs on; --root {host.root} "
                             "is a captured tree, so its links are not probed")
            log.info("probe_disabled", reason=self.disabled)
        else:
            try:
                self.backend = open_backend(spec, state.topology)
            except (ProbeUnavailable, ConfigError, OSError) as exc:
                self.disabled = f"probe backend {spec!r} unavailable: {exc}"
                log.warning("probe_disabled", reason=self.disabled)
        self.links = LinkState(tuple(self.backend.links() if self.backend else ()) + self._reportable_links())
        self.sampler = Sampler(SamplerSettings(
            min_interval_s=section["min_interval_seconds"], max_interval_s=section["max_interval_seconds"],
            budget_share=section["budget_share"], probe_leased_gpus=section["probe_leased_gpus"]),
            started=time.time())

    def _reportable_links(self) -> tuple:
        """Every GPU pair's p2p link: jobs report what they measure (POST /v1/telemetry)
        whichever backend probes, or none does."""
        from topod.probe.backend import parse_link

        addresses = self._gpu_addresses()
        indices = sorted(addresses)
        return tuple(parse_link(f"p2p/gpu{a}/gpu{b}", addresses) for i, a in enumerate(indices) for b in indices[i + 1:])

    def _gpu_addresses(self) -> dict[int, str]:
        return {gpu.index: gpu.address for gpu in self.state.topology.gpus}

    def _leased_addresses(self) -> list[str]:
        addresses = self._gpu_addresses()
        return [addresses[g] for g in self._leased_gpus() if g in addresses]

    async def iteration(self) -> float:
        """One cycle when due; returns the seconds until the next check."""
        from topod.probe.sampler import run_cycle

        if self.backend is None:
            return IDLE_RECHECK_SECONDS
        if self.sampler.due(time.time()):
            report = await asyncio.to_thread(run_cycle, self.backend, self.links, self.sampler,
                                             self._leased_addresses())
            for event in report.summary.events:
                self._publish(event.event, **event.fields())
            self.state.set_probe_results(self.links.measurements(), self.links.corrections())
        return max(1.0, self.sampler.seconds_until_due(time.time()))

    def report(self) -> dict:
        from topod.probe.linkstate import links_document

        now = time.time()
        doc = links_document(self.links, self.state.topology, now, self.state.findings,
                             sampler=self.sampler.to_json(now))
        doc["enabled"] = self.backend is not None
        if self.disabled:
            doc["reason"] = self.disabled
        return doc

    def telemetry(self, body, authorize=None) -> dict:  # noqa: ANN001 - validated by LinkState
        outcome = self.links.telemetry_body(body, time.time(), self._gpu_addresses(), authorize)
        for event in outcome.events:
            self._publish(event.event, **event.fields())
        if outcome.folded:
            self.state.set_corrections(self.links.corrections())
        return {"link": str(outcome.link), "bandwidth_gbps": outcome.bandwidth_gbps, "folded": outcome.folded,
                "reason": outcome.reason}

    def leases_changed(self) -> None:
        self.sampler.on_lease_change(time.time())

    def hardware_changed(self) -> None:
        self.sampler.on_topology_change(time.time())
        self.links.register(tuple(self.backend.links() if self.backend else ()) + self._reportable_links())

    def close(self) -> None:
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception as exc:  # noqa: BLE001 - closing must not stop a shutdown
                log.warning("probe_close_failed", error=repr(exc))
