"""The values the engine takes and gives: Request (validated from JSON), FreeState and
Decision (with its Placement and Performance). How a field is judged:
topod.alloc.jsonfields; the fields the engine does not see: topod.alloc.service_request.

A request for `gpus` 0 is a lease without GPUs: `cpus` logical CPUs (whole cores), near
the device or node `near` names (topod.alloc.near), decided by topod.alloc.cpulease. Its
Decision has no GPUs and carries its CPUs in `cpu_only`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from topod.alloc.errors import InvalidRequestError
from topod.alloc.jsonfields import integer_field, integral, kind_of, shown, text_field, text_problem
from topod.alloc.nics import MAX_NICS_PER_GPU, NicChoice
from topod.alloc.service_request import SERVICE_FIELDS
from topod.alloc.slotinit import slot_init, slot_setters

LEVELS = ("best", "good", "any")  # strongest first
MAX_GPUS = 4096
MAX_CPUS_PER_GPU = 4096
PCI_ADDRESS = re.compile(r"^(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
GPU_UUID = re.compile(r"^(gpu|mig)-[0-9a-f-]{8,}$")
MAX_MODEL_LENGTH = 128
MAX_JOB_LENGTH = 256
MIN_PRIORITY, MAX_PRIORITY = -1_000_000, 1_000_000
MAX_MEMORY_MIB = 1 << 40
MAX_CPUS = 1 << 16  # a lease without GPUs: logical CPUs (far beyond any kernel's NR_CPUS)
MAX_NEAR_LENGTH = 64
# `near`: a device by its kernel name (nvme1, mlx5_0, eth0, enp65s0f1), a PCI address, or node:N.
NEAR_NODE = re.compile(r"^node:([0-9]{1,9})$")
DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")

FIELDS = ("gpus", "must_include", "level", "priority", "cpus_per_gpu", "min_memory_mib", "model",
          "preemptible", "job", "gpu_memory_nodes", "nics_per_gpu", "cpus", "near")
# What a lease without GPUs cannot ask for, with the values that ask for nothing.
GPU_ONLY = (("model", (None,)), ("min_memory_mib", (0,)), ("gpu_memory_nodes", (False,)), ("nics_per_gpu", (None, 0)))


@dataclass(frozen=True, slots=True)
class Request:
    gpus: int
    must_include: tuple[int | str, ...] = ()  # GPU indices or PCI addresses
    level: str = "good"
    priority: int = 0
    cpus_per_gpu: int | str = 0  # logical CPUs, rounded up to whole cores; or "auto" (topod.alloc.cores)
    min_memory_mib: int = 0
    model: str | None = None  # case-insensitive substring of the GPU name
    preemptible: bool = False
    job: str | None = None
    gpu_memory_nodes: bool = False  # also bind to each GPU's own memory node (Grace: GPU memory is NUMA)
    nics_per_gpu: int | None = None  # RDMA NIC ports per GPU, required; None: the nearest one, best effort
    cpus: int = 0  # gpus 0 only: logical CPUs, rounded up to whole cores (topod.alloc.cpulease)
    near: str | None = None  # gpus 0 only: device name, PCI address or "node:N" the CPUs are chosen near

    @classmethod
    def from_json(cls, body: Any) -> Request:
        """Validate a JSON object; every error names the field (InvalidRequestError)."""
        if not isinstance(body, dict):
            raise InvalidRequestError("request", f"expected a JSON object, got {kind_of(body)}")
        unknown = sorted(str(key) for key in body if key not in FIELDS)
        if unknown:
            raise InvalidRequestError(unknown[0], f"unknown field; known fields: {', '.join(FIELDS + SERVICE_FIELDS)}")
        if "gpus" not in body:
            raise InvalidRequestError("gpus", "required: the number of GPUs (an integer >= 1; 0 with `cpus` "
                                              "for a lease without GPUs)")
        gpus = integer_field(body, "gpus", minimum=0, maximum=MAX_GPUS)
        cpus, near = _cpu_lease_fields(body, gpus)
        must = _must_include(body.get("must_include", []))
        if len(must) > gpus:
            raise InvalidRequestError("must_include", f"names {len(must)} GPUs but the request is for {gpus}")
        level = body.get("level", "good")
        if not isinstance(level, str) or level not in LEVELS:
            raise InvalidRequestError("level", f"expected one of {', '.join(LEVELS)}, got {level!r}")
        preemptible = body.get("preemptible", False)
        if not isinstance(preemptible, bool):
            raise InvalidRequestError("preemptible", f"expected true or false, got {kind_of(preemptible)}")
        gpu_memory_nodes = body.get("gpu_memory_nodes", False)
        if not isinstance(gpu_memory_nodes, bool):
            raise InvalidRequestError("gpu_memory_nodes", f"expected true or false, got {kind_of(gpu_memory_nodes)}")
        request = cls(
            gpus=gpus,
            must_include=must,
            level=level,
            priority=integer_field(body, "priority", default=0, minimum=MIN_PRIORITY, maximum=MAX_PRIORITY),
            cpus_per_gpu=_cpus_per_gpu(body),
            min_memory_mib=integer_field(body, "min_memory_mib", default=0, minimum=0, maximum=MAX_MEMORY_MIB),
            model=text_field(body, "model", MAX_MODEL_LENGTH),
            preemptible=preemptible,
            job=text_field(body, "job", MAX_JOB_LENGTH),
            gpu_memory_nodes=gpu_memory_nodes,
            nics_per_gpu=None if body.get("nics_per_gpu") is None
            else integer_field(body, "nics_per_gpu", minimum=0, maximum=MAX_NICS_PER_GPU),
            cpus=cpus,
            near=near,
        )
        if not gpus:
            for name, nothing in GPU_ONLY:
                if getattr(request, name) not in nothing:
                    raise InvalidRequestError(name, "asks about GPUs, and a lease with gpus 0 has none; leave it out")
        return request

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus, "must_include": list(self.must_include), "level": self.level,
            "priority": self.priority, "cpus_per_gpu": self.cpus_per_gpu, "min_memory_mib": self.min_memory_mib,
            "model": self.model, "preemptible": self.preemptible, "job": self.job,
            "gpu_memory_nodes": self.gpu_memory_nodes,
        } | ({} if self.nics_per_gpu is None else {"nics_per_gpu": self.nics_per_gpu}) \
          | ({} if self.gpus else {"cpus": self.cpus}) | ({} if self.near is None else {"near": self.near})


def _cpu_lease_fields(body: dict, gpus: int) -> tuple[int, str | None]:
    """(cpus, near) of a lease without GPUs; (0, None) for a GPU request, which takes
    neither (its CPUs come per GPU: cpus_per_gpu)."""
    if gpus:
        for name in ("cpus", "near"):
            if name in body:
                raise InvalidRequestError(name, "only for a lease without GPUs (gpus 0); a GPU lease gets its "
                                                "CPUs per GPU, near each GPU: use cpus_per_gpu")
        return 0, None
    if body.get("cpus") is None:
        raise InvalidRequestError("cpus", "required when gpus is 0: the number of CPUs of a lease without GPUs "
                                          "(an integer >= 1)")
    return integer_field(body, "cpus", minimum=1, maximum=MAX_CPUS), _near(body)


def _near(body: dict) -> str | None:
    """`near` as the engine resolves it: a PCI address with its domain, lower case;
    node:N; or a device name as given (kernel names are case-sensitive)."""
    value = text_field(body, "near", MAX_NEAR_LENGTH)
    if value is None:
        return None
    address = value.lower()
    if PCI_ADDRESS.match(address):
        return address if address.count(":") == 2 else f"0000:{address}"
    node = NEAR_NODE.match(value)
    if node:
        return f"node:{int(node.group(1))}"
    if not DEVICE_NAME.match(value):
        raise InvalidRequestError("near", f"{value!r} is neither a device name (nvme1, mlx5_0, eth0), a PCI "
                                          "address like 0000:81:00.0 nor node:N")
    return value


def _cpus_per_gpu(body: dict) -> int | str:
    if body.get("cpus_per_gpu") == "auto":
        return "auto"
    if isinstance(body.get("cpus_per_gpu"), str):
        raise InvalidRequestError("cpus_per_gpu", f"expected an integer or \"auto\", got {body['cpus_per_gpu']!r}"[:200])
    return integer_field(body, "cpus_per_gpu", default=0, minimum=0, maximum=MAX_CPUS_PER_GPU)


def _must_include(value: Any) -> tuple[int | str, ...]:
    if not isinstance(value, list):
        raise InvalidRequestError("must_include", f"expected an array of GPU indices or PCI addresses, got {kind_of(value)}")
    out: list[int | str] = []
    for item in value:
        if integral(item) is not None:
            item = integral(item)
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise InvalidRequestError("must_include", f"expected GPU indices or PCI addresses, got {kind_of(item)}")
        if isinstance(item, int):
            if item < 0:
                raise InvalidRequestError("must_include", f"GPU index must be >= 0, got {shown(item)}")
            if item > MAX_GPUS:
                raise InvalidRequestError("must_include", f"GPU index must be <= {MAX_GPUS}, got {shown(item)}")
            out.append(item)
            continue
        problem = text_problem(item)
        if problem:
            raise InvalidRequestError("must_include", problem)
        address = item.strip().lower()
        if GPU_UUID.match(address):
            out.append(item.strip())
            continue
        if not PCI_ADDRESS.match(address):
            raise InvalidRequestError("must_include", f"{item!r} is neither a GPU index, a PCI address "
                                                      "like 0000:18:00.0 nor a GPU UUID")
        out.append(address if address.count(":") == 2 else f"0000:{address}")
    if len(set(out)) != len(out):
        raise InvalidRequestError("must_include", "lists a GPU twice")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class FreeState:
    """What is taken right now; the engine never changes it."""

    busy_gpus: frozenset[int] = frozenset()  # GPU indices held by leases
    busy_cpus: frozenset[int] = frozenset()  # CPUs held by leases
    reserved_cpus: frozenset[int] = frozenset()  # housekeeping CPUs from the config
    # node -> load in [0, 1] (1 = saturated), e.g. the node's CPU or memory-bandwidth
    # utilisation; drives back-pressure (topod.alloc.policy). Absent nodes count as 0.
    node_load: dict[int, float] = field(default_factory=dict)
    busy_nics: frozenset[str] = frozenset()  # NIC port keys (address/port) leases hold (topod.alloc.nics)
    nic_use: dict[str, int] = field(default_factory=dict)  # NIC port key -> leases carrying it
    # GPU indices of each running lease: which busy GPUs come back together. The
    # look-ahead weighs what each lease's end would give back (topod.alloc.packing);
    # empty: busy GPUs only, as before.
    lease_gpus: tuple[frozenset[int], ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """One chosen GPU with its CPUs and the memory node its host buffers belong on."""

    index: int
    address: str
    numa_node: int | None
    cpus: tuple[int, ...]
    cpu_node: int | None  # the node the CPUs came from (differs only in the 'any' fallback)
    nics: tuple[NicChoice, ...] = ()  # RDMA NIC ports this GPU sends through, nearest first

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "address": self.address, "numa_node": self.numa_node,
                "cpus": list(self.cpus), "cpu_node": self.cpu_node, "memory_node": self.numa_node,
                "nics": [nic.to_json() for nic in self.nics]}


@dataclass(frozen=True, slots=True)
class Performance:
    """See topod.alloc.estimate for how each figure is computed."""

    relative_bandwidth: float  # 1.0 = as fast as the best set of this size on this host
    weakest_pair: str | None  # e.g. 'NVS18', 'PIX', 'SYS'; None for one GPU
    weakest_pair_gbps: float | None
    level_floors: dict[str, float]  # level -> relative bandwidth that level guarantees at least

    def to_json(self) -> dict[str, Any]:
        return {"relative_allreduce_bandwidth": round(self.relative_bandwidth, 4), "weakest_pair": self.weakest_pair,
                "weakest_pair_gbps": None if self.weakest_pair_gbps is None else round(self.weakest_pair_gbps, 2),
                "level_floors": {k: round(v, 4) for k, v in self.level_floors.items()},
                "basis": "ring all-reduce bounded by the weakest GPU pair, relative to the host's best set"}


@dataclass(frozen=True, slots=True)
class Decision:
    gpus: tuple[int, ...]  # GPU indices, sorted
    placements: tuple[Placement, ...]
    cpus: dict[int, tuple[int, ...]]  # GPU index -> its CPUs
    memory_nodes: tuple[int, ...]
    numa_nodes: tuple[int, ...]  # nodes the GPUs span
    cost: float  # sum of pairwise DistanceModel weights
    best_cost: float  # the 'best' level's reference cost for this size
    level: str  # the strongest level the set reaches
    requested_level: str
    satisfaction: float  # share of GPU pairs on one NUMA node; 1.0 for one GPU
    performance: Performance
    exact: bool  # the search proved optimality (False: node budget ran out)
    cpu_fallback: bool  # some CPUs are off the GPU's node ('any' only)
    reasons: tuple[str, ...] = field(default=())
    cpu_only: tuple[int, ...] = ()  # a lease without GPUs: its CPUs, sorted (no GPU's: `cpus` is empty)
    near: str | None = None  # a lease without GPUs: the device or node its CPUs were chosen near

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus_indices": list(self.gpus),
            "gpus": [placement.to_json() for placement in self.placements],
            "cpus": sorted([*(cpu for cpus in self.cpus.values() for cpu in cpus), *self.cpu_only]),
            "cpus_by_gpu": {str(gpu): list(cpus) for gpu, cpus in sorted(self.cpus.items())},
            "memory_nodes": list(self.memory_nodes),
            "numa_nodes": list(self.numa_nodes),
            "cost": round(self.cost, 6),
            "best_cost": round(self.best_cost, 6),
            "level": self.level,
            "requested_level": self.requested_level,
            "satisfaction": round(self.satisfaction, 6),
            "performance": self.performance.to_json(),
            "exact": self.exact,
            "cpu_fallback": self.cpu_fallback,
            "reasons": list(self.reasons),
        } | ({} if self.near is None else {"near": self.near})


_PLACEMENT = slot_setters(Placement)
_PERFORMANCE = slot_setters(Performance)
_DECISION = slot_setters(Decision)


def _placement_init(self, index, address, numa_node, cpus, cpu_node, nics=()) -> None:  # noqa: ANN001
    set_index, set_address, set_numa_node, set_cpus, set_cpu_node, set_nics = _PLACEMENT
    set_index(self, index)
    set_address(self, address)
    set_numa_node(self, numa_node)
    set_cpus(self, cpus)
    set_cpu_node(self, cpu_node)
    set_nics(self, nics)


def _performance_init(self, relative_bandwidth, weakest_pair, weakest_pair_gbps, level_floors) -> None:  # noqa: ANN001
    set_relative, set_pair, set_gbps, set_floors = _PERFORMANCE
    set_relative(self, relative_bandwidth)
    set_pair(self, weakest_pair)
    set_gbps(self, weakest_pair_gbps)
    set_floors(self, level_floors)


def _decision_init(self, gpus, placements, cpus, memory_nodes, numa_nodes, cost, best_cost, level,  # noqa: ANN001
                   requested_level, satisfaction, performance, exact, cpu_fallback, reasons=(), cpu_only=(),
                   near=None) -> None:
    (set_gpus, set_placements, set_cpus, set_memory_nodes, set_numa_nodes, set_cost, set_best_cost, set_level,
     set_requested_level, set_satisfaction, set_performance, set_exact, set_cpu_fallback, set_reasons,
     set_cpu_only, set_near) = _DECISION
    set_gpus(self, gpus)
    set_placements(self, placements)
    set_cpus(self, cpus)
    set_memory_nodes(self, memory_nodes)
    set_numa_nodes(self, numa_nodes)
    set_cost(self, cost)
    set_best_cost(self, best_cost)
    set_level(self, level)
    set_requested_level(self, requested_level)
    set_satisfaction(self, satisfaction)
    set_performance(self, performance)
    set_exact(self, exact)
    set_cpu_fallback(self, cpu_fallback)
    set_reasons(self, reasons)
    set_cpu_only(self, cpu_only)
    set_near(self, near)


slot_init(Placement, _placement_init)
slot_init(Performance, _performance_init)
slot_init(Decision, _decision_init)
