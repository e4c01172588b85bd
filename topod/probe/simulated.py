"""The simulated backend: measurements read off a ground-truth link table.

The table (JSON or TOML) says how the host really behaves, which may differ from what
its firmware claims:

  true_numa_node   {"gpu3": 1}: where a device really hangs (firmware may say otherwise)
  classes          bandwidth/latency per link class: mem_local, mem_remote, h2d_local,
                   h2d_remote, d2h_local, d2h_remote, and p2p.<level> for the PCIe/NVLink
                   level of a GPU pair on the *true* topology (PIX, PXB, PHB, NODE, SYS,
                   NV, NVS; NV/NVS may give bandwidth_gbps_per_link)
  links            per-link overrides: {"p2p/gpu0/gpu1": {"bandwidth_gbps": 20.0}}
  degradations     [{"link": "p2p/gpu0/gpu2" | "through_switch_of": "gpu0",
                     "from_s": 60, "until_s": null, "factor": 0.3}]: bandwidth times
                   factor while from_s <= t < until_s (t = seconds since the backend opened)
  device_kinds     which devices get h2d/d2h links (default ["gpu"])
  noise, seed      multiplicative Gaussian noise (sigma) from a seeded generator

A degradation through a switch hits every link that crosses that switch's uplink: p2p
pairs with exactly one end below the switch, and h2d/d2h links to devices below it.
"""

from __future__ import annotations

import json
import random
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topod.distance import DistanceModel
from topod.errors import ConfigError
from topod.model import Topology
from topod.probe.backend import LinkId, LinkSyntaxError, ProbeResult, ProbeSizes, ProbeUnavailable, node_end, parse_link
from topod.record import replace
from topod.textfile import read_text_file

DEFAULT_SIZES = ProbeSizes(small_bytes=4096, small_reps=32, large_bytes=32 << 20, large_reps=3)
CLASS_KEYS = ("mem_local", "mem_remote", "h2d_local", "h2d_remote", "d2h_local", "d2h_remote", "p2p")
TABLE_KEYS = ("description", "true_numa_node", "classes", "links", "degradations", "device_kinds", "noise", "seed")


@dataclass(frozen=True, slots=True)
class LinkTruth:
    bandwidth_gbps: float
    latency_us: float


@dataclass(frozen=True, slots=True)
class Degradation:
    links: frozenset[LinkId]
    from_s: float
    until_s: float | None
    factor: float

    def active(self, t: float) -> bool:
        return self.from_s <= t and (self.until_s is None or t < self.until_s)


MAX_TABLE_BYTES = 16 << 20


def load_table(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    text = read_text_file(str(path), MAX_TABLE_BYTES, "link table")
    language = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        table = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"link table {path}: not valid {language}: {exc}") from exc
    except RecursionError:  # both parsers recurse per nesting level
        raise ConfigError(f"link table {path}: not valid {language}: nested too deep") from None
    if not isinstance(table, dict):
        raise ConfigError(f"link table {path}: expected an object at the top")
    unknown = sorted(set(table) - set(TABLE_KEYS))
    if unknown:
        raise ConfigError(f"link table {path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(TABLE_KEYS)})")
    return table


def true_topology(topology: Topology, true_nodes: dict[str, int]) -> Topology:
    """The host as it really is: devices moved to the node the table says."""
    addresses = {f"gpu{gpu.index}": gpu.address for gpu in topology.gpus}
    moved = {addresses.get(key, key): node for key, node in true_nodes.items()}
    devices = tuple(replace(d, numa_node=moved[d.address]) if d.address in moved else d for d in topology.pci_devices)
    gpus = tuple(replace(g, numa_node=moved[g.address]) if g.address in moved else g for g in topology.gpus)
    return replace(topology, pci_devices=devices, gpus=gpus)


@dataclass(slots=True)
class SimulatedBackend:
    topology: Topology  # what firmware says
    table: dict[str, Any]
    source: str = "<table>"
    clock: Callable[[], float] = time.time
    sizes: ProbeSizes = DEFAULT_SIZES
    name: str = "simulated"
    truth: Topology = field(init=False)
    _links: dict[LinkId, LinkTruth] = field(init=False)
    _degradations: list[Degradation] = field(init=False)
    _rng: random.Random = field(init=False)
    _start: float = field(init=False)

    def __post_init__(self) -> None:
        where = f"link table {self.source}"
        true_nodes = self.table.get("true_numa_node", {})
        if not isinstance(true_nodes, dict) or not all(isinstance(v, int) for v in true_nodes.values()):
            raise ConfigError(f"{where}: true_numa_node must map device names to node numbers")
        self.truth = true_topology(self.topology, true_nodes)
        self._links = self._build_links(where)
        specs = self.table.get("degradations", [])
        self._degradations = [self._degradation(where, i, spec) for i, spec in enumerate(specs)]
        self._rng = random.Random(self.table.get("seed", 0))
        self._start = self.clock()

    @classmethod
    def from_file(cls, path: str | Path, topology: Topology, **options: Any) -> SimulatedBackend:
        return cls(topology, load_table(path), str(path), **options)

    def _gpu_addresses(self) -> dict[int, str]:
        return {gpu.index: gpu.address for gpu in self.topology.gpus}

    def _build_links(self, where: str) -> dict[LinkId, LinkTruth]:
        classes = self.table.get("classes", {})
        unknown = sorted(set(classes) - set(CLASS_KEYS))
        if unknown:
            raise ConfigError(f"{where}: classes: unknown class(es) {', '.join(unknown)} "
                              f"(known: {', '.join(CLASS_KEYS)})")
        kinds = tuple(self.table.get("device_kinds", ["gpu"]))
        devices = [d for d in self.truth.pci_devices if d.kind in kinds]
        nodes = [n.id for n in self.truth.numa_nodes]
        links: dict[LinkId, LinkTruth] = {}
        for i in (n.id for n in self.truth.numa_nodes if n.cpus):
            for j in nodes:
                name = "mem_local" if i == j else "mem_remote"
                links[LinkId("mem", node_end(i), node_end(j))] = _truth(where, classes, name)
        for device in devices:
            for j in nodes:
                where_to = "local" if device.numa_node == j else "remote"
                links[LinkId("h2d", node_end(j), device.address)] = _truth(where, classes, f"h2d_{where_to}")
                links[LinkId("d2h", device.address, node_end(j))] = _truth(where, classes, f"d2h_{where_to}")
        model = DistanceModel(self.truth)
        gpus = sorted(self.truth.gpus, key=lambda g: g.index)
        for n, a in enumerate(gpus):
            for b in gpus[n + 1:]:
                distance = model.gpus(a.index, b.index)
                links[LinkId("p2p", a.address, b.address)] = _p2p_truth(where, classes, distance.level, distance.links)
        for text, override in self.table.get("links", {}).items():
            link = self._parse(where, "links", text)
            if link not in links:
                raise ConfigError(f"{where}: links: {text} is not a link of this host")
            base = links[link]
            links[link] = LinkTruth(float(override.get("bandwidth_gbps", base.bandwidth_gbps)),
                                    float(override.get("latency_us", base.latency_us)))
        return links

    def _parse(self, where: str, key: str, text: str) -> LinkId:
        try:
            return parse_link(text, self._gpu_addresses())
        except LinkSyntaxError as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from exc

    def _degradation(self, where: str, index: int, spec: dict[str, Any]) -> Degradation:
        key = f"degradations[{index}]"
        factor = spec.get("factor")
        if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise ConfigError(f"{where}: {key}.factor must be a number in (0, 1], got {factor!r}")
        if "link" in spec:
            hit = frozenset({self._parse(where, key, spec["link"])})
        elif "through_switch_of" in spec:
            hit = self._through_switch(where, key, spec["through_switch_of"])
        else:
            raise ConfigError(f"{where}: {key}: needs 'link' or 'through_switch_of'")
        until = spec.get("until_s")
        return Degradation(hit, float(spec.get("from_s", 0.0)), None if until is None else float(until), float(factor))

    def _through_switch(self, where: str, key: str, name: str) -> frozenset[LinkId]:
        address = self._gpu_addresses().get(int(name[3:])) if name.startswith("gpu") and name[3:].isdigit() else name
        device = self.truth.device(address or "")
        if device is None or device.switch is None:
            raise ConfigError(f"{where}: {key}.through_switch_of: {name} is no device below a PCIe switch")
        below = {d.address for d in self.truth.pci_devices if d.switch == device.switch}
        hit = set()
        for link in self._links:
            if link.kind == "p2p" and ((link.src in below) != (link.dst in below)):
                hit.add(link)
            elif link.device in below:
                hit.add(link)
        return frozenset(hit)

    def links(self) -> list[LinkId]:
        return sorted(self._links)

    def elapsed(self) -> float:
        return self.clock() - self._start

    def measure(self, link: LinkId) -> ProbeResult:
        truth = self._links.get(link)
        if truth is None:
            raise ProbeUnavailable(f"{link}: not a link of the simulated host")
        t = self.elapsed()
        factor = 1.0
        for degradation in self._degradations:
            if link in degradation.links and degradation.active(t):
                factor *= degradation.factor
        noise = float(self.table.get("noise", 0.0))
        jitter = min(1.5, max(0.5, self._rng.gauss(1.0, noise))) if noise else 1.0
        bandwidth = truth.bandwidth_gbps * factor * jitter
        latency = truth.latency_us / jitter
        s = self.sizes
        seconds = (s.small_reps * (latency * 1e-6 + s.small_bytes / (bandwidth * 1e9))
                   + s.large_reps * (latency * 1e-6 + s.large_bytes / (bandwidth * 1e9)))
        return ProbeResult(link, latency, bandwidth, s, seconds, s.bytes_per_link, self.clock(), self.name,
                           "simulated" + (f"; degraded x{factor:g}" if factor != 1.0 else ""))

    def close(self) -> None:
        return None


def _truth(where: str, classes: dict[str, Any], name: str) -> LinkTruth:
    spec = classes.get(name)
    if not isinstance(spec, dict) or "bandwidth_gbps" not in spec:
        raise ConfigError(f"{where}: classes.{name} needs bandwidth_gbps (and latency_us)")
    return _checked(where, name, spec.get("bandwidth_gbps"), spec.get("latency_us", 1.0))


def _p2p_truth(where: str, classes: dict[str, Any], level: str, links: int) -> LinkTruth:
    spec = classes.get("p2p", {}).get(level)
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: classes.p2p.{level} is missing (a GPU pair on this host is {level})")
    bandwidth = spec.get("bandwidth_gbps")
    if bandwidth is None and "bandwidth_gbps_per_link" in spec:
        bandwidth = float(spec["bandwidth_gbps_per_link"]) * max(1, links)
    return _checked(where, f"p2p.{level}", bandwidth, spec.get("latency_us", 1.0))


def _checked(where: str, name: str, bandwidth: Any, latency: Any) -> LinkTruth:
    for key, value in (("bandwidth_gbps", bandwidth), ("latency_us", latency)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{where}: classes.{name}.{key} must be a positive number, got {value!r}")
    return LinkTruth(float(bandwidth), float(latency))
