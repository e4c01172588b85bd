"""Compare measurements with the model; correct what firmware got wrong. Pure.

Two checks:

* Locality. For each device with host-transfer measurements (h2d and d2h from several
  memory nodes), the node it is fastest from is where it really hangs. When that node
  beats the node sysfs gives by `locality_ratio`, the device (and its Gpu entry) moves
  there with numa_node_source "measured", and a `firmware_locality_mismatch` warning
  says what firmware claimed and what the transfers showed. ACPI tables do lie; a
  factor of 1.3 is far above probe noise and far below a real cross-socket penalty
  (the seed reports 2-3x).
* Degraded pairs. A GPU pair whose peer bandwidth is below `degraded_ratio` of what its
  level (NV#, PIX, NODE, SYS...) should give is reported. What a level should give is
  `expected_p2p_gbps[label]` when configured, else the median of the measured pairs of
  the same level on this host (needs `min_peers` of them), so no datasheet is needed.

Call it with the *discovered* topology each time; it returns a new Topology built with
topod.record.replace and never edits its input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from topod.distance import DistanceModel
from topod.model import HostWarning, Topology
from topod.probe.backend import Measurement, median
from topod.record import replace


@dataclass(frozen=True, slots=True)
class CalibrationSettings:
    locality_ratio: float = 1.3  # best node's bandwidth / the firmware node's, to move a device
    min_samples: int = 1  # samples a link's estimate must rest on before it counts
    degraded_ratio: float = 0.5  # pair bandwidth / its level's expected, below which it is degraded
    min_peers: int = 3  # pairs of one level needed to use their median as the expectation
    expected_p2p_gbps: Mapping[str, float] = field(default_factory=dict)  # level label -> GB/s

    def __post_init__(self) -> None:
        if self.locality_ratio <= 1.0:
            raise ValueError(f"locality_ratio must be above 1, got {self.locality_ratio}")
        if not 0 < self.degraded_ratio < 1:
            raise ValueError(f"degraded_ratio must be in (0, 1), got {self.degraded_ratio}")


@dataclass(frozen=True, slots=True)
class Finding:
    code: str  # firmware_locality_mismatch | link_degraded
    subject: str  # a PCI address, or "addrA addrB" for a pair
    reason: str
    data: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "subject": self.subject, "reason": self.reason, **dict(self.data)}


@dataclass(frozen=True, slots=True)
class Calibration:
    topology: Topology
    findings: tuple[Finding, ...]


def calibrate(topology: Topology, measurements: Iterable[Measurement],
              settings: CalibrationSettings | None = None) -> Calibration:
    settings = settings or CalibrationSettings()
    usable = [m for m in measurements if m.samples >= settings.min_samples and m.bandwidth_gbps > 0]
    corrected, locality = _correct_locality(topology, usable, settings)
    degraded = _degraded_pairs(corrected, usable, settings)
    return Calibration(corrected, tuple(locality) + tuple(degraded))


def host_bandwidth_by_node(measurements: Iterable[Measurement]) -> dict[str, dict[int, float]]:
    """device address -> memory node -> mean of its h2d and d2h bandwidth from that node."""
    samples: dict[str, dict[int, list[float]]] = {}
    for m in measurements:
        device, node = m.link.device, m.link.host_node
        if device is None or node is None:
            continue
        samples.setdefault(device, {}).setdefault(node, []).append(m.bandwidth_gbps)
    return {device: {node: sum(v) / len(v) for node, v in nodes.items()} for device, nodes in samples.items()}


def _correct_locality(topology: Topology, measurements: list[Measurement],
                      settings: CalibrationSettings) -> tuple[Topology, list[Finding]]:
    moves: dict[str, int] = {}
    findings: list[Finding] = []
    for address, by_node in sorted(host_bandwidth_by_node(measurements).items()):
        device = topology.device(address)
        if device is None or len(by_node) < 2:
            continue  # one node measured says nothing about which is nearer
        best = max(by_node, key=lambda n: by_node[n])
        claimed = device.numa_node
        if best == claimed:
            continue
        if claimed in by_node:
            baseline = by_node[claimed]
        else:  # firmware says nothing (or names an unmeasured node): compare with the runner-up
            baseline = max(v for n, v in by_node.items() if n != best)
        if by_node[best] < settings.locality_ratio * baseline:
            continue
        moves[address] = best
        said = "no node" if claimed is None else f"node {claimed}"
        findings.append(Finding(
            "firmware_locality_mismatch", address,
            f"sysfs says {said} (from {device.numa_node_source}); transfers are {by_node[best] / baseline:.1f}x "
            f"faster from node {best} ({by_node[best]:.1f} vs {baseline:.1f} GB/s); using node {best}",
            {"firmware_node": claimed, "measured_node": best,
             "bandwidth_by_node": {str(n): round(v, 3) for n, v in sorted(by_node.items())}},
        ))
    if not moves:
        return topology, findings
    return _moved(topology, moves, findings), findings


def _moved(topology: Topology, moves: dict[str, int], findings: list[Finding]) -> Topology:
    devices = []
    for device in topology.pci_devices:
        node = moves.get(device.address)
        if node is None:
            devices.append(device)
            continue
        numa = topology.node(node)
        cpus = numa.local_cpus or numa.cpus if numa is not None else device.local_cpus
        devices.append(replace(device, numa_node=node, numa_node_source="measured", local_cpus=tuple(cpus)))
    gpus = tuple(replace(g, numa_node=moves[g.address]) if g.address in moves else g for g in topology.gpus)
    warnings = topology.warnings + tuple(
        HostWarning(f.code, f"sys/bus/pci/devices/{f.subject}/numa_node", f.reason) for f in findings)
    return replace(topology, pci_devices=tuple(devices), gpus=gpus, warnings=warnings)


def _degraded_pairs(topology: Topology, measurements: list[Measurement],
                    settings: CalibrationSettings) -> list[Finding]:
    model = DistanceModel(topology)
    gpu_addresses = {gpu.address for gpu in topology.gpus}
    by_label: dict[str, list[Measurement]] = {}
    for m in measurements:
        pair = m.link.pair
        if pair is None or not set(pair) <= gpu_addresses:
            continue
        by_label.setdefault(model.between(*pair).label, []).append(m)
    findings = []
    for label, entries in sorted(by_label.items()):
        expected = settings.expected_p2p_gbps.get(label)
        if expected is None:
            if len(entries) < settings.min_peers:
                continue
            expected = median([m.bandwidth_gbps for m in entries])
        for m in entries:
            if m.bandwidth_gbps < settings.degraded_ratio * expected:
                a, b = m.link.pair or ("", "")
                findings.append(Finding(
                    "link_degraded", f"{a} {b}",
                    f"{label} pair gives {m.bandwidth_gbps:.1f} GB/s, {m.bandwidth_gbps / expected:.0%} of the "
                    f"{expected:.1f} GB/s its level should give",
                    {"link": str(m.link), "level": label, "measured_gbps": round(m.bandwidth_gbps, 3),
                     "expected_gbps": round(expected, 3)},
                ))
    return findings
