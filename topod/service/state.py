"""The one owner of host state: what discovery found, the probe's corrections layered on
it, the distance model built from both, and each node's load.

Tasks read from it and are told of changes through listeners; nobody else assigns a
topology. A rescan that finds the same hardware changes nothing (no distance cache thrown
away, no IRQ re-plan); calibrated locality survives a rescan, re-applied to the new tree;
the distance model is rebuilt only when the topology or the link corrections change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import structlog

from topod.distance import DistanceModel
from topod.model import Topology

log = structlog.get_logger("topod")

# What changed, for listeners: "hardware" (a rescan found other devices), "calibration"
# (probe results moved a device's locality), "links" (measured link corrections only).
Listener = Callable[[str], None]


class HostState:
    def __init__(self, discovered: Topology) -> None:
        self.discovered = discovered
        self.topology = discovered
        self.corrections: dict[tuple[str, str], float] = {}
        self.measurements: Sequence[Any] = ()
        self.findings: tuple = ()
        self.distances = DistanceModel(discovered, corrections={})
        self.node_load: dict[int, float] = {}
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    # -- writers ------------------------------------------------------------------
    def set_discovered(self, discovered: Topology) -> bool:
        """A rescan's result; False (and nothing happens) when the hardware is the same."""
        if discovered == self.discovered:
            return False
        self.discovered = discovered
        self._rebuild(self._calibrated(discovered), self.corrections)
        self._notify("hardware")
        return True

    def set_probe_results(self, measurements: Sequence[Any], corrections: dict[tuple[str, str], float]) -> bool:
        """The probe's latest measurements: locality calibration and link corrections."""
        self.measurements = tuple(measurements)
        topology = self._calibrated(self.discovered)
        corrections = dict(corrections)
        if topology == self.topology and corrections == self.corrections:
            return False
        kind = "calibration" if topology != self.topology else "links"
        self._rebuild(topology, corrections)
        self._notify(kind)
        return True

    def set_corrections(self, corrections: dict[tuple[str, str], float]) -> bool:
        """Link corrections alone (job telemetry folded in)."""
        corrections = dict(corrections)
        if corrections == self.corrections:
            return False
        self._rebuild(self.topology, corrections)
        self._notify("links")
        return True

    def set_node_load(self, load: dict[int, float]) -> None:
        # A measurement, not a change of hardware: read by the engine, heard by nobody.
        self.node_load = dict(load)

    # -- internals ----------------------------------------------------------------
    def _calibrated(self, discovered: Topology) -> Topology:
        if not self.measurements:
            self.findings = ()
            return discovered
        from topod.probe.calibrate import calibrate

        calibration = calibrate(discovered, self.measurements)
        self.findings = calibration.findings
        return calibration.topology

    def _rebuild(self, topology: Topology, corrections: dict[tuple[str, str], float]) -> None:
        if topology is not self.topology or corrections != self.corrections:
            self.topology = topology
            self.corrections = corrections
            self.distances = DistanceModel(topology, corrections=corrections)

    def _notify(self, kind: str) -> None:
        for listener in self._listeners:
            try:
                listener(kind)
            except Exception as exc:  # noqa: BLE001 - one broken listener must not hide the change from others
                log.error("state_listener_failed", change=kind, listener=getattr(listener, "__qualname__", "?"),
                          error=repr(exc))
