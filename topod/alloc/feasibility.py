"""Could the empty host ever satisfy a request (pure)? `impossibility` answers with the
refusal no release could lift, or None.

A refusal the engine makes now (too few free GPUs, cores or NICs) is retryable: leases
end and the request may fit. That is true only when the request fits this host with
nothing leased. When it does not, waiting is pointless, so the request is refused at
once with `retryable: false` (topoctl exits 1, not 75), and a waiting request is
answered then rather than at its timeout. One function decides it, for the immediate
answer and for the queue (topod.service.leases, which serves both).

What the empty host means: this topology, every GPU, core and NIC port free, only the
reserved (housekeeping) CPUs out; isolated and nohz_full CPUs are never leased at all.
Checked in order, each with a message that says which resource is short:
1. GPUs: none on the host; none of the requested model (case-insensitive substring, as
   the engine filters); fewer than asked that match the model and memory filter.
2. CPUs per GPU (a number; "auto" never makes a request impossible, topod.alloc.cores):
   at levels best and good each GPU's whole cores come from its own NUMA node, so the
   GPUs' nodes must serve `gpus` of them on the empty host; at level 'any' cores may
   come from any node, so the host's nodes together must.
3. NIC ports per GPU (`nics_per_gpu`): more than the host's ACTIVE RDMA ports; with
   [alloc] nics = "exclusive", more than all of them for the whole lease.
4. What is left (the resources together: a level whose NUMA-node limit leaves too few
   cores, say) is the engine's own word on the empty host: the decision it would make
   with nothing leased. Its refusal is the verdict.
Verdicts are kept per host view (a new topology is a new view), by request, reserved
CPUs and policy, so a request the queue asks about again costs a lookup.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from topod.alloc.cores import node_capacity, node_cores
from topod.alloc.coretables import view_core_map
from topod.alloc.eligibility import eligible_gpus
from topod.alloc.engine import allocate
from topod.alloc.errors import (AllocationError, InsufficientCpusError, InsufficientGpusError, InsufficientNicsError,
                                LevelUnreachableError)
from topod.alloc.hostview import HostView, host_view
from topod.alloc.nics import nic_ports_by_state
from topod.alloc.nodecores import usable_cores
from topod.alloc.policy import PolicySettings
from topod.alloc.request import FreeState, Request
from topod.distance import DistanceModel
from topod.model import Topology

# The refusals an empty host can give: each takes (message, retryable=).
CAPACITY_ERRORS = (InsufficientGpusError, InsufficientCpusError, InsufficientNicsError, LevelUnreachableError)
VERDICTS_KEPT = 256  # per host view


@dataclass(frozen=True, slots=True)
class Never:
    """A verdict: the refusal's kind and message (an error is built fresh each time it is
    raised, so no traceback is shared between answers)."""

    kind: type[AllocationError]
    message: str

    def error(self) -> AllocationError:
        return self.kind(self.message, retryable=False)  # type: ignore[call-arg]


def impossibility(topology: Topology, distances: DistanceModel, request: Request,
                  reserved_cpus: Iterable[int] = (), policy: PolicySettings = PolicySettings()) -> AllocationError | None:
    """The refusal (retryable False) the empty host would give this request, or None when
    the empty host could grant it. See the module docstring."""
    view = host_view(topology, distances)
    reserved = frozenset(reserved_cpus)
    # What a request is called and how urgent it is change no verdict: one kept per shape.
    request = replace(request, job=None, priority=0, preemptible=False)
    key = (request, reserved, policy)
    kept = view.cache.setdefault("never", {})
    try:
        verdict = kept.get(key, False)
    except TypeError:  # a request built in code with a list where the schema gives a tuple
        verdict = _verdict(view, request, reserved, policy)
    else:
        if verdict is False:
            verdict = kept[key] = _verdict(view, request, reserved, policy)
            if len(kept) > VERDICTS_KEPT:
                del kept[next(iter(kept))]
    return verdict.error() if verdict is not None else None


def _verdict(view: HostView, request: Request, reserved: frozenset[int], policy: PolicySettings) -> Never | None:
    if not request.gpus:  # a lease without GPUs (topod.alloc.cpulease): the engine's word on the empty host
        return _empty_host_refuses(view, request, reserved, policy)
    return (_gpus_short(view, request) or _cpus_short(view, request, reserved)
            or _nics_short(view, request, policy) or _empty_host_refuses(view, request, reserved, policy))


def _gpus_short(view: HostView, request: Request) -> Never | None:
    k = request.gpus
    if view.n == 0:
        return Never(InsufficientGpusError, "this host has no GPUs")
    names = sorted({gpu.name or "unnamed" for gpu in view.gpus})
    if request.model and not any(request.model.lower() in (gpu.name or "").lower() for gpu in view.gpus):
        return Never(InsufficientGpusError, f"model {request.model!r}: no GPU of this host is one "
                                            f"(its GPUs: {', '.join(names)})")
    eligible = eligible_gpus(view, request, [])
    if k > len(eligible):
        matching = ("" if eligible is view.everyone else
                    " matching" + (f" model {request.model!r}" if request.model else "")
                    + (f" with at least {request.min_memory_mib} MiB" if request.min_memory_mib else ""))
        return Never(InsufficientGpusError, f"{k} GPUs requested; this host has {len(eligible)} GPUs{matching}")
    return None


def _cpus_short(view: HostView, request: Request, reserved: frozenset[int]) -> Never | None:
    per_gpu = request.cpus_per_gpu
    if not isinstance(per_gpu, int) or per_gpu <= 0:
        return None  # none asked, or "auto" (never impossible on the empty host)
    capacity = node_capacity(view.topology, set(reserved), per_gpu, view_core_map(view))
    most_node, most = _largest_node(view, reserved)
    largest = f"the most one NUMA node has is {most} (node {most_node})" if most_node is not None else \
        "this host has no usable CPU"
    k = request.gpus
    if request.level == "any":  # cores may come from the nearest node that has them
        served = sum(capacity.values())
        if served < k:
            short = (f"no NUMA node of this host has {per_gpu} usable whole-core CPUs" if not served else
                     f"the host's NUMA nodes hold {served} such blocks, not {k}")
            return Never(InsufficientCpusError,
                         f"cpus_per_gpu {per_gpu}: each GPU's CPUs come from one NUMA node, and {short}, even with "
                         f"nothing leased ({largest}; reserved, isolated and nohz_full CPUs excluded)")
        return None
    eligible = eligible_gpus(view, request, [])
    on_node: dict[int, int] = {}
    for p in eligible:
        on_node[view.node[p]] = on_node.get(view.node[p], 0) + 1
    served = sum(min(count, capacity.get(node, 0)) for node, count in on_node.items())
    if served < k:
        return Never(InsufficientCpusError,
                     f"cpus_per_gpu {per_gpu} at level '{request.level}': each GPU's CPUs come from its own NUMA "
                     f"node, and with nothing leased the GPUs' nodes can serve {served} of the {k} GPU(s) "
                     f"({largest}; reserved, isolated and nohz_full CPUs excluded; level 'any' may take "
                     "them from other nodes)")
    return None


def _largest_node(view: HostView, reserved: frozenset[int]) -> tuple[int | None, int]:
    """(node, usable logical CPUs) of the node with the most on the empty host."""
    best: tuple[int | None, int] = (None, 0)
    for node, cores in sorted(node_cores(view.topology, set(reserved), view_core_map(view)).items()):
        cpus = sum(len(core) for core in usable_cores(cores))
        if cpus > best[1]:
            best = (node, cpus)
    return best


def _nics_short(view: HostView, request: Request, policy: PolicySettings) -> Never | None:
    per_gpu = request.nics_per_gpu
    if not per_gpu or policy.nics == "none":  # "none" with nics_per_gpu is the engine's 400
        return None
    ports = nic_ports_by_state(view.topology, ())["free"]
    if per_gpu > ports:
        return Never(InsufficientNicsError, f"nics_per_gpu {per_gpu}: this host offers {ports} active RDMA NIC "
                                            "port(s) in all")
    needed = per_gpu * request.gpus
    if policy.nics == "exclusive" and needed > ports:
        return Never(InsufficientNicsError, f"nics_per_gpu {per_gpu} for {request.gpus} GPU(s) needs {needed} NIC "
                                            f"port(s) of its own; this host offers {ports} active ones in all "
                                            "([alloc] nics = \"exclusive\")")
    return None


def _empty_host_refuses(view: HostView, request: Request, reserved: frozenset[int],
                        policy: PolicySettings) -> Never | None:
    try:
        allocate(view.topology, view.distances, FreeState(reserved_cpus=reserved), request, policy)
    except CAPACITY_ERRORS as exc:
        return Never(type(exc), f"{exc} (even with nothing leased on this host)")
    except AllocationError:
        return None  # a malformed request: the live decision refuses it itself, not retryable
    return None
