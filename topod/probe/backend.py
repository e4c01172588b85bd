"""The probe interface: which links a backend can measure, and the values it returns.

A link is directed and named by its two ends: a NUMA node ("node1") or a PCI address
("0000:18:00.0"). Kinds:

  mem   CPU node -> memory node   (a thread on src's CPUs copies buffers bound to dst)
  h2d   memory node -> device     (pinned buffer on src, device memory on dst)
  d2h   device -> memory node
  p2p   device -> device          (peer copy; the pair the DistanceModel weighs)

Latency is the median time of one small transfer; bandwidth is the median rate of large
ones. Every result says which sizes and how many repetitions produced it, and what it
cost (seconds, bytes), so the sampler can keep probing within its budget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

LINK_KINDS = ("mem", "h2d", "d2h", "p2p")
_NODE = re.compile(r"^node(\d+)$")
_GPU = re.compile(r"^gpu(\d+)$")
_PCI = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class LinkSyntaxError(ValueError):
    """A link name that is not kind/src/dst with known kinds and end names."""


@dataclass(frozen=True, slots=True, order=True)
class LinkId:
    kind: str
    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.src}/{self.dst}"

    @property
    def pair(self) -> tuple[str, str] | None:
        """The PCI address pair a p2p link weighs in the DistanceModel, sorted."""
        if self.kind != "p2p":
            return None
        a, b = sorted((self.src, self.dst))
        return a, b

    @property
    def device(self) -> str | None:
        """The PCI end of an h2d/d2h link."""
        if self.kind == "h2d":
            return self.dst
        if self.kind == "d2h":
            return self.src
        return None

    @property
    def host_node(self) -> int | None:
        """The memory node of an h2d/d2h link (the buffer's node)."""
        end = self.src if self.kind == "h2d" else self.dst if self.kind == "d2h" else None
        return node_of(end) if end else None


def node_of(end: str) -> int | None:
    match = _NODE.match(end)
    return int(match.group(1)) if match else None


def node_end(node: int) -> str:
    return f"node{node}"


def parse_link(text: str, gpu_addresses: dict[int, str] | None = None) -> LinkId:
    """'p2p/0000:18:00.0/0000:19:00.0' -> LinkId. With gpu_addresses, 'gpu3' ends are
    accepted and turned into that GPU's PCI address (jobs know indices, not addresses)."""
    if not isinstance(text, str):
        raise LinkSyntaxError(f"link must be a string like 'h2d/node0/0000:18:00.0', got {type(text).__name__}")
    parts = text.strip().split("/")
    if len(parts) != 3:
        raise LinkSyntaxError(f"link {text!r}: expected kind/src/dst, e.g. 'p2p/gpu0/gpu1' or 'h2d/node0/0000:18:00.0'")
    kind, src, dst = (part.strip().lower() for part in parts)
    if kind not in LINK_KINDS:
        raise LinkSyntaxError(f"link {text!r}: kind {kind!r} is not one of {', '.join(LINK_KINDS)}")
    src, dst = (_end(text, end, gpu_addresses) for end in (src, dst))
    want = {"mem": ("node", "node"), "h2d": ("node", "pci"), "d2h": ("pci", "node"), "p2p": ("pci", "pci")}[kind]
    got = tuple("node" if _NODE.match(end) else "pci" for end in (src, dst))
    if got != want:
        raise LinkSyntaxError(f"link {text!r}: a {kind} link goes {want[0]} -> {want[1]}, got {got[0]} -> {got[1]}")
    if src == dst and kind == "p2p":
        raise LinkSyntaxError(f"link {text!r}: a p2p link needs two different devices")
    return LinkId(kind, src, dst)


def _end(text: str, end: str, gpu_addresses: dict[int, str] | None) -> str:
    if _NODE.match(end) or _PCI.match(end):
        return end
    gpu = _GPU.match(end)
    if gpu and gpu_addresses is not None:
        index = int(gpu.group(1))
        if index not in gpu_addresses:
            raise LinkSyntaxError(f"link {text!r}: no GPU {index} on this host")
        return gpu_addresses[index]
    raise LinkSyntaxError(f"link {text!r}: end {end!r} is neither nodeN, gpuN nor a PCI address like 0000:18:00.0")


@dataclass(frozen=True, slots=True)
class ProbeSizes:
    """Transfer sizes and repetitions; a backend's defaults fit its medium."""

    small_bytes: int = 64
    small_reps: int = 64
    large_bytes: int = 16 << 20
    large_reps: int = 4

    def __post_init__(self) -> None:
        for name in ("small_bytes", "small_reps", "large_bytes", "large_reps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"probe sizes: {name} must be a positive integer, got {value!r}")

    @property
    def bytes_per_link(self) -> int:
        return self.small_bytes * self.small_reps + self.large_bytes * self.large_reps


@dataclass(frozen=True, slots=True)
class ProbeResult:
    link: LinkId
    latency_us: float  # median of small transfers
    bandwidth_gbps: float  # median of large transfers, GB/s = 1e9 bytes/s
    sizes: ProbeSizes
    seconds: float  # wall time the probe took, setup included
    bytes_moved: int
    time: float  # when it was measured (wall clock)
    backend: str
    note: str = ""  # e.g. how buffers were bound

    def to_json(self) -> dict[str, object]:
        return {
            "link": str(self.link),
            "latency_us": round(self.latency_us, 3),
            "bandwidth_gbps": round(self.bandwidth_gbps, 3),
            "small_bytes": self.sizes.small_bytes,
            "small_reps": self.sizes.small_reps,
            "large_bytes": self.sizes.large_bytes,
            "large_reps": self.sizes.large_reps,
            "seconds": round(self.seconds, 6),
            "bytes_moved": self.bytes_moved,
            "time": self.time,
            "backend": self.backend,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class Measurement:
    """What calibration reads: a link's current bandwidth estimate and its weight."""

    link: LinkId
    bandwidth_gbps: float
    latency_us: float | None = None
    samples: int = 1


def measurements_of(results: Iterable[ProbeResult]) -> list[Measurement]:
    """Collapse raw results (several per link) to one median Measurement per link."""
    by_link: dict[LinkId, list[ProbeResult]] = {}
    for result in results:
        by_link.setdefault(result.link, []).append(result)
    return [
        Measurement(link, median([r.bandwidth_gbps for r in rs]), median([r.latency_us for r in rs]), len(rs))
        for link, rs in sorted(by_link.items())
    ]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


class ProbeUnavailable(RuntimeError):
    """A backend (or one link of it) cannot measure here; the message says why."""


class ProbeBackend(Protocol):
    name: str

    def links(self) -> list[LinkId]:
        """Every link this backend can measure on this host."""

    def measure(self, link: LinkId) -> ProbeResult:
        """Measure one link; ProbeUnavailable when it cannot."""

    def close(self) -> None:
        """Release buffers and contexts."""
