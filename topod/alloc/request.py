"""Allocation requests and decisions: validated values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topod.errors import AllocationError

LEVELS = ("best", "good", "any")


def allocation_error(code: str, message: str) -> AllocationError:
    error = AllocationError(message)
    error.code = code
    return error


@dataclass(frozen=True, slots=True)
class Request:
    gpus: int
    must_include: tuple[int | str, ...] = ()
    level: str = "good"
    priority: int = 0
    cpus_per_gpu: int = 0
    min_memory_mib: int | None = None
    model: str | None = None
    preemptible: bool = False
    job: str | None = None

    @classmethod
    def from_json(cls, body: Any) -> Request:
        if not isinstance(body, dict):
            raise allocation_error("invalid_request", "request must be a JSON object")
        unknown = set(body) - set(cls.__dataclass_fields__)
        if unknown:
            raise allocation_error("invalid_request", f"unknown field(s): {', '.join(sorted(unknown))}")
        if "gpus" not in body:
            raise allocation_error("invalid_request", "gpus: required (number of GPUs)")
        gpus = _int(body, "gpus", minimum=1)
        must = body.get("must_include", [])
        if not isinstance(must, list) or not all(
                (isinstance(m, int) and not isinstance(m, bool) and m >= 0) or isinstance(m, str) for m in must):
            raise allocation_error("invalid_request", "must_include: expected a list of GPU indices or PCI addresses")
        if len(must) > gpus:
            raise allocation_error("invalid_request", f"must_include: {len(must)} GPUs named but only {gpus} requested")
        level = body.get("level", "good")
        if level not in LEVELS:
            raise allocation_error("invalid_request", f"level: expected one of {', '.join(LEVELS)}")
        for name in ("model", "job"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise allocation_error("invalid_request", f"{name}: expected a string")
        if "preemptible" in body and not isinstance(body["preemptible"], bool):
            raise allocation_error("invalid_request", "preemptible: expected true or false")
        return cls(
            gpus=gpus,
            must_include=tuple(must),
            level=level,
            priority=_int(body, "priority", minimum=None, default=0),
            cpus_per_gpu=_int(body, "cpus_per_gpu", minimum=0, default=0),
            min_memory_mib=_int(body, "min_memory_mib", minimum=0, default=None),
            model=body.get("model"),
            preemptible=body.get("preemptible", False),
            job=body.get("job"),
        )


def _int(body: dict, name: str, minimum: int | None, default: Any = ...) -> Any:
    if name not in body or body[name] is None:
        if default is ...:
            raise allocation_error("invalid_request", f"{name}: required")
        return default
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise allocation_error("invalid_request", f"{name}: expected an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise allocation_error("invalid_request", f"{name}: must be >= {minimum}")
    return value


@dataclass(frozen=True, slots=True)
class FreeState:
    busy_gpus: frozenset[int] = frozenset()
    busy_cpus: frozenset[int] = frozenset()
    reserved_cpus: frozenset[int] = frozenset()
    node_load: dict[int, float] = field(default_factory=dict)


# Relative collective bandwidth of a set, by the level of its weakest pair (vs all-NVLink).
LEVEL_ESTIMATE = {"X": 1.0, "NV": 1.0, "NVS": 1.0, "PIX": 0.5, "PXB": 0.45, "PHB": 0.4, "NODE": 0.35, "SYS": 0.25}


@dataclass(frozen=True, slots=True)
class GpuPick:
    index: int
    address: str
    uuid: str | None
    numa_node: int | None
    cpus: tuple[int, ...]
    cpu_node: int | None  # where its CPUs are (differs from numa_node only in an 'any' fallback)


@dataclass(frozen=True, slots=True)
class Decision:
    picks: tuple[GpuPick, ...]
    cost: float
    best_cost: float
    level: str
    satisfaction: float
    weakest_link: str
    estimate: float
    reasons: tuple[str, ...] = ()

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(p.index for p in self.picks)

    def to_json(self) -> dict[str, Any]:
        cpus = sorted({c for p in self.picks for c in p.cpus})
        return {
            "gpus_indices": list(self.gpus),
            "gpus": [{"index": p.index, "address": p.address, "uuid": p.uuid, "numa_node": p.numa_node,
                      "cpus": list(p.cpus), "cpu_node": p.cpu_node} for p in self.picks],
            "cpus": cpus,
            "memory_nodes": sorted({p.numa_node for p in self.picks if p.numa_node is not None}),
            "cost": round(self.cost, 4),
            "best_cost": round(self.best_cost, 4),
            "level": self.level,
            "satisfaction": round(self.satisfaction, 4),
            "weakest_link": self.weakest_link,
            "performance_estimate": self.estimate,
            "reasons": list(self.reasons),
        }
