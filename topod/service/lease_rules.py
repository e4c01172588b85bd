"""Who may ask for what: an owner process the caller may name, a priority above
`[alloc] max_priority_non_root`, how many GPUs its uid and groups may hold (`[alloc]
max_gpus_per_uid`, `max_gpus_per_group`: topod.alloc.quota), link telemetry (it steers
everyone's placements)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from topod.alloc.errors import QuotaError
from topod.alloc.quota import GpuQuotas, quota_refusal
from topod.alloc.service_request import ServiceRequest
from topod.api.peer import Caller
from topod.errors import TopodError
from topod.service.lease import Lease
from topod.service.owner import descends_from


class PermissionDeniedError(TopodError):
    code = "permission_denied"


def authorize_request(service: ServiceRequest, request: Any, caller: Caller, max_priority_non_root: int) -> None:
    """What a request may ask for depends on who asks: an owner process that is the
    caller or its descendant (root: any but PID 1 and topod itself, which never exit),
    and a priority above [alloc] max_priority_non_root only for root."""
    pid = service.owner_pid
    if pid:
        if pid in (1, os.getpid()):
            raise PermissionDeniedError(f"owner_pid {pid} never exits ({'init' if pid == 1 else 'topod itself'}): "
                                        "the lease would never end; give the job's own pid, or a ttl")
        if not caller.is_admin and not descends_from(pid, caller.pid):
            raise PermissionDeniedError(f"owner_pid {pid} is neither the calling process ({caller.pid}) nor one "
                                        "of its descendants; only root may name another process")
    if request.priority > max_priority_non_root and not caller.is_admin:
        raise PermissionDeniedError(f"priority {request.priority} is above {max_priority_non_root} "
                                    "([alloc] max_priority_non_root): only root may ask for more")


def over_quota(quotas: GpuQuotas, caller: Caller, gpus: int, leases: Callable[[], Iterable[Lease]]) -> QuotaError | None:
    """The refusal of `gpus` more GPUs for this caller against the GPUs its uid and its
    groups' members hold in `leases()` (every lease in the table: granted ones from their
    grant on), or None. `leases` is called only when a cap is set."""
    if quotas.unlimited:
        return None
    return quota_refusal(quotas, caller.uid, caller.gid, gpus,
                         ((lease.owner_uid, lease.owner_gid, len(lease.gpus)) for lease in leases()))


def telemetry_authority(caller: Caller, leases: Iterable[Lease]) -> Callable[[Any], None] | None:
    """Who may report a link's bandwidth: root any link; anyone else only links whose
    every end is a GPU or memory node of one of its own leases. None: no check (root)."""
    if caller.is_admin:
        return None
    own = [lease for lease in leases if lease.owner_uid == caller.uid]
    addresses = {address for lease in own for address in lease.addresses}
    nodes = {f"node{node}" for lease in own for node in lease.memory_nodes}

    def authorize(link: Any) -> None:
        foreign = [end for end in (link.src, link.dst) if end not in addresses and end not in nodes]
        if foreign:
            raise PermissionDeniedError(f"telemetry for {link}: {', '.join(foreign)} is not a GPU or memory node "
                                        f"of a lease of uid {caller.uid}; only root may report other links")

    return authorize
