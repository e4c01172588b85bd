"""The allocation service: the engine's decisions carried out on durable leases.

Pure decisions come from topod.alloc.engine/policy; this shell owns the lease store, the
waiting queue, expiry, owner-process watching and gentle preemption. Nothing here
computes a placement itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from topod.alloc.errors import InvalidRequestError
from topod.alloc.request import ServiceRequest
from topod.api.peer import Caller
from topod.service.lease_store import Lease, LeaseStore
from topod.service.owner import OwnerWatch, process_start_time
from topod.distance import DistanceModel
from topod.errors import AllocationError, TopodError
from topod.events import EventBus
from topod.model import Topology

WAITABLE_CODES = ("insufficient_gpus", "level_unreachable", "insufficient_cpus")


class PermissionDeniedError(TopodError):
    code = "permission_denied"


class LeaseNotFoundError(TopodError):
    code = "lease_not_found"


class QueueFullError(TopodError):
    code = "queue_full"


class WaitTimeoutError(AllocationError):
    code = "wait_timeout"


@dataclass(slots=True)
class Waiter:
    request: Any
    service: ServiceRequest
    caller: Caller
    enqueued: float
    future: asyncio.Future
    victims: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


class AllocationService:
    def __init__(self, topology: Topology, store: LeaseStore, bus: EventBus, settings: dict[str, Any],
                 reserved_cpus: set[int], clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.reserved_cpus = set(reserved_cpus)
        self.clock = clock
        self.waiters: list[Waiter] = []
        self.owner_watch = OwnerWatch(self._owner_exited)
        from topod.export.metrics import LatencyHistogram

        # Cumulative since start, as a Prometheus histogram must be (a window would let
        # bucket counters go down between scrapes).
        self.decision_latency = LatencyHistogram()
        self.results: dict[str, int] = {}
        self.corrections: dict[tuple[str, str], float] = {}
        # The daemon may add per-lease files (an NCCL topology) to a lease's environment.
        self.extra_environment: Callable[[Lease], dict[str, str]] | None = None
        self.on_lease_end: Callable[[Lease], None] | None = None
        self.set_topology(topology)

    # -- topology -------------------------------------------------------------
    def set_topology(self, topology: Topology) -> None:
        self.topology = topology
        self.distances = DistanceModel(topology, corrections=self.corrections)

    def set_corrections(self, corrections: dict[tuple[str, str], float]) -> None:
        self.corrections = dict(corrections)
        self.distances = DistanceModel(self.topology, corrections=self.corrections)

    # -- views ----------------------------------------------------------------
    def leases(self) -> list[Lease]:
        return self.store.all()

    def leased_gpus(self) -> set[int]:
        return {gpu for lease in self.store.all() for gpu in lease.gpus}

    def leased_cpus(self) -> set[int]:
        return {cpu for lease in self.store.all() for cpu in lease.cpus}

    def free_state(self):
        from topod.alloc.request import FreeState

        leases = self.store.all()
        # node_load is a utilisation share (0-1) per node; topod has no such measurement
        # yet, so back-pressure stays neutral rather than mistaking leased GPUs for load.
        node_load: dict[int, float] = {}
        return FreeState(
            busy_gpus=frozenset(g for lease in leases for g in lease.gpus),
            busy_cpus=frozenset(c for lease in leases for c in lease.cpus),
            reserved_cpus=frozenset(self.reserved_cpus),
            node_load=node_load,
        )

    # -- allocation -----------------------------------------------------------
    def parse(self, body: Any):
        from topod.alloc.request import Request

        service, engine_body = ServiceRequest.split(body)
        engine_body.setdefault("level", self.settings.get("default_level", "good"))
        return service, Request.from_json(engine_body)

    def decide(self, request, waited: float = 0.0, ttl_seconds: float | None = None):
        from topod.alloc.engine import allocate
        from topod.alloc.policy import PolicySettings

        fields = PolicySettings.__dataclass_fields__
        policy = PolicySettings(**{k: v for k, v in self.settings.items() if k in fields})
        started = time.perf_counter()
        try:
            return allocate(self.topology, self.distances, self.free_state(), request, policy,
                            waited_seconds=waited, ttl_seconds=ttl_seconds)
        finally:
            self.decision_latency.observe(time.perf_counter() - started)

    def grant(self, request, decision, service: ServiceRequest, caller: Caller) -> Lease:
        now = self.clock()
        owner_pid = service.owner_pid
        body = decision.to_json()
        lease = Lease(
            id=uuid.uuid4().hex[:16],
            state="active",
            owner_uid=caller.uid,
            owner_gid=caller.gid,
            requester_pid=caller.pid,
            owner_pid=owner_pid,
            job=getattr(request, "job", None),
            priority=int(getattr(request, "priority", 0)),
            preemptible=bool(getattr(request, "preemptible", False)),
            gpus=tuple(body["gpus_indices"]),
            cpus=tuple(body["cpus"]),
            memory_nodes=tuple(body["memory_nodes"]),
            created=now,
            expires=now + service.ttl_seconds if service.ttl_seconds else None,
            ttl_seconds=service.ttl_seconds,
            decision={**body, "owner_start_time": process_start_time(owner_pid) if owner_pid else None},
        )
        environment = self.environment(lease)
        if self.extra_environment is not None:
            environment.update(self.extra_environment(lease))
        lease = replace(lease, decision={**lease.decision, "environment": environment})
        self.store.add(lease)
        if owner_pid:
            self.owner_watch.watch(lease.id, owner_pid)
        self._count("granted")
        self.bus.publish("lease_granted", lease=lease.id, gpus=list(lease.gpus), cpus=len(lease.cpus),
                         uid=lease.owner_uid, job=lease.job, level=body.get("level"))
        return lease

    def environment(self, lease: Lease) -> dict[str, str]:
        """What a job needs to use its lease: devices, CPUs, memory nodes."""
        from topod.cpulist import format_cpulist

        gpus = [self.topology.gpu(g) for g in lease.gpus]
        uuids = [g.uuid for g in gpus if g is not None and g.uuid]
        visible = uuids if len(uuids) == len(gpus) else [str(g) for g in lease.gpus]
        picks = lease.decision.get("gpus", [])
        return {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(visible),
            "TOPOD_LEASE": lease.id,
            "TOPOD_GPUS": ",".join(map(str, lease.gpus)),
            "TOPOD_CPUS": format_cpulist(lease.cpus),
            "TOPOD_MEMORY_NODES": ",".join(map(str, lease.memory_nodes)),
            "TOPOD_GPU_CPUS": ";".join(f"{p['index']}:{format_cpulist(p['cpus'])}" for p in picks),
            "TOPOD_GPU_NODES": ";".join(f"{p['index']}:{'' if p['numa_node'] is None else p['numa_node']}"
                                        for p in picks),
        }

    async def allocate(self, body: Any, caller: Caller) -> Lease:
        if not caller.may_allocate:
            self._count("denied")
            raise PermissionDeniedError("only root and members of the topod group may allocate")
        try:
            service, request = self.parse(body)
        except TopodError:
            self._count("invalid")
            raise
        if service.owner_pid and not _process_exists(service.owner_pid):
            self._count("invalid")
            raise InvalidRequestError("owner_pid", f"no process {service.owner_pid}")
        try:
            return self.grant(request, self.decide(request, ttl_seconds=service.ttl_seconds), service, caller)
        except AllocationError as exc:
            if service.wait_seconds <= 0 or exc.code not in WAITABLE_CODES or not getattr(exc, "retryable", True):
                self._count("rejected")
                raise
        return await self._wait(request, service, caller)

    async def _wait(self, request, service: ServiceRequest, caller: Caller) -> Lease:
        if len(self.waiters) >= int(self.settings.get("max_queue", 256)):
            self._count("queue_full")
            raise QueueFullError(f"{len(self.waiters)} requests already waiting; try again later")
        waiter = Waiter(request, service, caller, self.clock(), asyncio.get_running_loop().create_future())
        self.waiters.append(waiter)
        self.bus.publish("request_queued", request=waiter.id, gpus=getattr(request, "gpus", None),
                         priority=getattr(request, "priority", 0))
        self._maybe_preempt(waiter)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout=service.wait_seconds)
        except TimeoutError:
            self._count("timeout")
            raise WaitTimeoutError(f"no GPUs became available within {service.wait_seconds:g} s") from None
        finally:
            if not waiter.future.done():
                waiter.future.cancel()
            self._drop_waiter(waiter)

    def _drop_waiter(self, waiter: Waiter) -> None:
        if waiter in self.waiters:
            self.waiters.remove(waiter)
        for lease_id in waiter.victims:
            lease = self.store.get(lease_id)
            if lease is not None and lease.state == "preempting":
                self.store.update(replace(lease, state="active", preempt_deadline=None))
                self.bus.publish("preemption_cancelled", lease=lease_id, request=waiter.id)

    def process_queue(self) -> None:
        """Grant waiting requests that now fit, highest effective priority first."""
        from topod.alloc.policy import effective_priority

        now = self.clock()
        order = sorted(self.waiters, key=lambda w: -effective_priority(
            getattr(w.request, "priority", 0), now - w.enqueued, self.settings.get("aging_seconds", 60.0),
            self.settings.get("max_aging_boost", 10.0)))
        for waiter in order:
            if waiter.future.done():
                continue
            try:
                decision = self.decide(waiter.request, waited=now - waiter.enqueued,
                                       ttl_seconds=waiter.service.ttl_seconds)
            except AllocationError:
                continue
            lease = self.grant(waiter.request, decision, waiter.service, waiter.caller)
            waiter.victims = ()
            waiter.future.set_result(lease)

    def _maybe_preempt(self, waiter: Waiter) -> None:
        from topod.alloc.preemption import plan_preemption

        victims = plan_preemption(self.topology, self.distances, self.free_state(), waiter.request,
                                  [lease for lease in self.store.all() if lease.state == "active"])
        if not victims:
            return
        deadline = self.clock() + float(self.settings.get("preemption_grace_seconds", 300.0))
        for lease in victims:
            self.store.update(replace(lease, state="preempting", preempt_deadline=deadline))
            self.bus.publish("preemption_requested", lease=lease.id, deadline=deadline, request=waiter.id,
                             gpus=list(lease.gpus), uid=lease.owner_uid)
        waiter.victims = tuple(lease.id for lease in victims)

    # -- ending leases --------------------------------------------------------
    def get(self, lease_id: str) -> Lease:
        lease = self.store.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(f"no lease {lease_id}")
        return lease

    def release(self, lease_id: str, caller: Caller) -> Lease:
        lease = self.get(lease_id)
        if not (caller.is_admin or caller.uid == lease.owner_uid):
            raise PermissionDeniedError(f"lease {lease_id} belongs to uid {lease.owner_uid}")
        return self._end(lease, "lease_released", reason="released")

    def revoke(self, lease_id: str, caller: Caller, reason: str = "revoked by admin") -> Lease:
        if not caller.is_admin:
            raise PermissionDeniedError("revoking a lease is root-only")
        return self._end(self.get(lease_id), "lease_revoked", reason=reason)

    def renew(self, lease_id: str, caller: Caller, ttl_seconds: Any) -> Lease:
        lease = self.get(lease_id)
        if not (caller.is_admin or caller.uid == lease.owner_uid):
            raise PermissionDeniedError(f"lease {lease_id} belongs to uid {lease.owner_uid}")
        ttl = lease.ttl_seconds if ttl_seconds is None else ttl_seconds
        if ttl is None:
            raise InvalidRequestError("ttl_seconds", "this lease has no ttl; give one to renew")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
            raise InvalidRequestError("ttl_seconds", "expected a positive number of seconds")
        ttl = min(float(ttl), float(self.settings.get("renew_max_ttl_seconds", 7 * 86400)))
        renewed = replace(lease, expires=self.clock() + ttl, ttl_seconds=ttl)
        self.store.update(renewed)
        self.bus.publish("lease_renewed", lease=lease_id, expires=renewed.expires)
        return renewed

    def _end(self, lease: Lease, event: str, reason: str) -> Lease:
        self.store.remove(lease.id)
        self.owner_watch.unwatch(lease.id)
        if self.on_lease_end is not None:
            self.on_lease_end(lease)
        self.bus.publish(event, lease=lease.id, gpus=list(lease.gpus), reason=reason, uid=lease.owner_uid)
        self.process_queue()
        return lease

    def _owner_exited(self, lease_id: str) -> None:
        lease = self.store.get(lease_id)
        if lease is not None:
            self._end(lease, "lease_released", reason=f"owner process {lease.owner_pid} exited")

    def reap(self) -> list[Lease]:
        """End expired leases, leases whose owner died, and preemptions past their deadline."""
        now = self.clock()
        ended = []
        for lease in self.store.all():
            if lease.expires is not None and lease.expires <= now:
                ended.append(self._end(lease, "lease_released", reason="ttl expired"))
            elif lease.owner_pid and not _owner_alive(lease):
                ended.append(self._end(lease, "lease_released", reason=f"owner process {lease.owner_pid} exited"))
            elif lease.state == "preempting" and lease.preempt_deadline is not None and lease.preempt_deadline <= now:
                ended.append(self._end(lease, "lease_revoked", reason="preemption grace period over"))
        return ended

    def recover(self) -> int:
        """At start: every acknowledged lease is back; dead owners' and expired ones end."""
        ended = self.reap()
        for lease in self.store.all():
            if lease.owner_pid:
                self.owner_watch.watch(lease.id, lease.owner_pid)
        return len(ended)

    def _count(self, result: str) -> None:
        self.results[result] = self.results.get(result, 0) + 1


def _process_exists(pid: int) -> bool:
    try:
        import psutil

        return psutil.pid_exists(pid)
    except ImportError:  # pragma: no cover - psutil is a dependency
        return True


def _owner_alive(lease: Lease) -> bool:
    if not _process_exists(lease.owner_pid):
        return False
    recorded = lease.decision.get("owner_start_time")
    current = process_start_time(lease.owner_pid)
    # A recycled pid has another start time: the owner is gone.
    return recorded is None or current is None or abs(recorded - current) < 1.0
