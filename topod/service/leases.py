"""The lease service: the engine's decisions carried out on durable leases.

Pure decisions come from topod.alloc (engine, policy, preemption); this shell owns
granting: parsing a request, the decision, the grant and its delivery. Its mixins hold
the rest: the environment a lease comes with (topod.service.lease_environment), a request
that waits (topod.service.lease_waiting: the queue, gentle preemption), and what happens to
a lease after its grant (topod.service.lease_lifecycle: release, revoke, renewal, expiry,
owner-process watching, recovery, the leases' fate when hardware changes). Every change
goes through the LeaseStore, whose group commit resolves a future once the change is on
disk: callers answer only after it. A waiting request belongs to its connection: when
the client goes, so does the request, and a grant made in that instant is taken back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from topod.alloc.errors import InvalidRequestError
from topod.alloc.policy import PolicySettings
from topod.alloc.quota import GpuQuotas
from topod.alloc.request import FreeState
from topod.alloc.service_request import PID_MAX_LIMIT, RequestLimits, ServiceRequest
from topod.api.peer import Caller
from topod.enforce import lease_mode
from topod.errors import AllocationError, TopodError
from topod.events import EventBus
from topod.service.lease import DecisionMemo, Lease, new_id
from topod.service.lease_environment import LeaseEnvironment
from topod.service.lease_lifecycle import LeaseLifecycle
from topod.service.lease_queue import WAITABLE_CODES, Queued, Waiter
from topod.service.lease_rules import PermissionDeniedError, authorize_request, over_quota, telemetry_authority
from topod.service.lease_store import LeaseStore, LeaseStoreError
from topod.service.lease_waiting import LeaseWaiting
from topod.service.owner import OwnerWatch, process_exists, process_start_time
from topod.service.state import HostState

log = structlog.get_logger("topod")


class LeaseFiles(Protocol):
    """Files that come with a lease (topod.service.nccl_files.NcclFiles)."""

    def lease_environment(self, lease: Lease) -> dict[str, str]: ...
    def lease_has_files(self, lease: Lease) -> bool: ...
    def write_lease(self, lease: Lease) -> None: ...  # blocking: called in a worker thread
    def remove_lease(self, lease: Lease) -> None: ...


def _always_connected() -> bool:
    return True


class LeaseService(LeaseEnvironment, LeaseWaiting, LeaseLifecycle):
    def __init__(self, state: HostState, store: LeaseStore, bus: EventBus, settings: dict[str, Any],
                 reserved_cpus: set[int], clock: Callable[[], float] = time.time, pid_max: int = PID_MAX_LIMIT) -> None:
        self.pid_max = pid_max
        self.state = state
        self.store = store
        self.bus = bus
        self.clock = clock
        self.waiters: list[Waiter] = []
        self.owner_watch = OwnerWatch(self._owner_exited)
        from topod.export.metrics import LatencyHistogram

        # Cumulative since start, as a Prometheus histogram must be (a window would let
        # bucket counters go down between scrapes).
        self.decision_latency = LatencyHistogram()
        self.outcomes: dict[tuple[str, str], int] = {}  # (result, reason) -> requests
        # Files a lease comes with (the daemon's NCCL topology): named in its environment,
        # written in a worker thread before the answer, removed when it ends.
        self.files: LeaseFiles | None = None
        # What the host can enforce (topod.enforce), set by the daemon at start; a lease
        # records what it gets, never more than topod carries out.
        self.host_enforcement = "none"
        self._free: tuple[tuple, FreeState] | None = None  # (what it was built from, the FreeState)
        self._by_index: tuple[Any, tuple[dict[int, Any], dict[str, int]]] = (None, ({}, {}))
        self._environments = DecisionMemo()  # a decision's environment, per its uuids and the topology
        self.configure(settings, reserved_cpus)
        state.add_listener(self._state_changed)

    def configure(self, settings: dict[str, Any], reserved_cpus: set[int]) -> None:
        self.settings = dict(settings)
        self.reserved_cpus = set(reserved_cpus)
        fields = PolicySettings.__dataclass_fields__
        self.policy = PolicySettings(**{k: v for k, v in self.settings.items() if k in fields})
        self.limits = RequestLimits(max_wait_seconds=float(self.settings["max_wait_seconds"]),
                                    max_ttl_seconds=float(self.settings["renew_max_ttl_seconds"]),
                                    pid_max=self.pid_max)
        self.quotas = GpuQuotas.from_settings(self.settings)

    # -- views ----------------------------------------------------------------
    @property
    def topology(self):
        return self.state.topology

    @property
    def distances(self):
        return self.state.distances

    def leases(self) -> list[Lease]:
        return self.store.all()

    def leased_gpus(self) -> set[int]:
        """Indices of present GPUs that a lease holds (a lease's missing GPU is not here)."""
        present = self._gpu_addresses()
        return {present[address] for address in self.store.leased_addresses() if address in present}

    def free_gpus(self) -> int:
        return len(self.topology.gpus) - len(self.leased_gpus())

    def leased_cpus(self) -> set[int]:
        return self.store.leased_cpus()

    def leased_nics(self) -> dict[str, int]:
        """NIC port key (address/port) -> leases carrying it (topod.alloc.nics); like GPUs
        and CPUs, a released lease's ports stay held until its delete is on disk."""
        return self.store.leased_nics()

    def free_state(self) -> FreeState:
        """What is taken now; built again only after a change to the leases, the topology,
        the node loads or the reserved CPUs (each decision used to rebuild it from every lease)."""
        key = (self.store.generation, self.topology, self.state.node_load, self.reserved_cpus)
        cached = self._free
        if cached is not None and all(a is b for a, b in zip(cached[0], key)):
            return cached[1]
        use = self.leased_nics()
        free = FreeState(
            busy_gpus=frozenset(self.leased_gpus()),
            lease_gpus=self._lease_gpus(),
            busy_cpus=frozenset(self.leased_cpus()),
            reserved_cpus=frozenset(self.reserved_cpus),
            node_load=dict(self.state.node_load),
            busy_nics=frozenset(use),
            nic_use=use,
        )
        self._free = (key, free)
        return free

    def _lease_gpus(self) -> tuple[frozenset[int], ...]:
        """Present GPU indices per lease holding any: GPUs one lease holds free together,
        which the engine's look-ahead weighs (topod.alloc.packing)."""
        present = self._gpu_addresses()
        held: dict[str, set[int]] = {}
        for address in self.store.leased_addresses():
            if address in present:
                held.setdefault(self.store.holder_of(address), set()).add(present[address])
        return tuple(frozenset(gpus) for gpus in held.values())

    def _gpus_by_index(self) -> dict[int, Any]:
        """The topology's GPUs by index, built once per topology."""
        return self._gpu_maps()[0]

    def _gpu_addresses(self) -> dict[str, int]:
        """PCI address -> index of the topology's GPUs, built once per topology."""
        return self._gpu_maps()[1]

    def _gpu_maps(self) -> tuple[dict[int, Any], dict[str, int]]:
        topology = self.topology
        if self._by_index[0] is not topology:
            self._by_index = (topology, ({gpu.index: gpu for gpu in topology.gpus},
                                         {gpu.address: gpu.index for gpu in topology.gpus}))
        return self._by_index[1]

    # -- allocation -----------------------------------------------------------
    def parse(self, body: Any):
        from topod.alloc.request import Request

        service, engine_body = ServiceRequest.split(body, self.limits)
        engine_body.setdefault("level", self.settings["default_level"])
        engine_body.setdefault("cpus_per_gpu", self.settings["cpus_per_gpu"])
        return service, Request.from_json(engine_body)

    async def warm_up(self) -> bool:
        """Build the engine's view of this topology and its per-size references (47-151 ms
        on 16-64 GPUs) in a worker thread, then swap it in here on the loop: a decision
        made meanwhile uses the model's view as it was, or builds its own; never a
        half-filled one. False (nothing swapped) when the topology or distances changed
        meanwhile: the newer change warms up its own."""
        from topod.alloc.engine import prepare
        from topod.alloc.hostview import install_view

        topology, distances = self.topology, self.distances
        view = await asyncio.to_thread(prepare, topology, distances, self.free_state(), self.policy, fresh=True)
        if self.topology is not topology or self.distances is not distances:
            return False
        install_view(view)
        return True

    def decide(self, request, waited: float = 0.0, ttl_seconds: float | None = None):
        from topod.alloc.engine import allocate

        started = time.perf_counter()
        try:
            return allocate(self.topology, self.distances, self.free_state(), request, self.policy,
                            waited_seconds=waited, ttl_seconds=ttl_seconds)
        finally:
            self.decision_latency.observe(time.perf_counter() - started)

    def _grant(self, request, decision, service: ServiceRequest, caller: Caller) -> tuple[Lease, asyncio.Future | None]:
        """The lease in the mirror now; on disk when the returned commit resolves."""
        now = self.clock()
        owner_pid = service.owner_pid
        by_index = self._gpus_by_index()
        lease = Lease(
            id=new_id(), state="active",
            owner_uid=caller.uid, owner_gid=caller.gid, requester_pid=caller.pid,
            owner_pid=owner_pid, owner_start_time=process_start_time(owner_pid) if owner_pid else None,
            job=request.job, priority=request.priority, preemptible=request.preemptible,
            decision=decision,
            gpu_uuids=tuple((by_index[p.index].uuid if p.index in by_index else None) or None
                            for p in decision.placements),
            environment={},
            created=now, expires=now + service.ttl_seconds if service.ttl_seconds else None,
            ttl_seconds=service.ttl_seconds,
            # Neither a ttl nor an owner would ever end it: it counts as delivered only once
            # the answer is written (answered()); see recover() for a crash before that.
            confirmed=bool(service.ttl_seconds or owner_pid),
            enforcement=lease_mode(self.host_enforcement, bool(decision.cpu_only) or any(decision.cpus.values())),
        )
        # Filled in place: the lease is no one's yet, and a second Lease (replace) cost as much.
        lease.environment.update(self.environment(lease))
        commit = self.store.add(lease)
        if owner_pid:
            self.owner_watch.watch(lease.id, owner_pid)
        self._after(commit, lambda: self._granted(lease), lambda exc: self._grant_failed(lease, exc))
        return lease, commit

    def _granted(self, lease: Lease) -> None:
        self._count("granted", lease.decision.level)
        self.bus.publish("lease_granted", lease=lease.id, gpus=list(lease.gpus), cpus=len(lease.cpus),
                         uid=lease.owner_uid, job=lease.job, level=lease.decision.level)

    def _grant_failed(self, lease: Lease, exc: BaseException) -> None:
        self.owner_watch.unwatch(lease.id)
        self._count("failed", getattr(exc, "code", "error"))
        log.error("lease_not_stored", lease=lease.id, error=str(exc))

    def _authorize(self, service: ServiceRequest, request, caller: Caller) -> None:
        authorize_request(service, request, caller, int(self.settings.get("max_priority_non_root", 0)))

    def _over_quota(self, request, caller: Caller) -> AllocationError | None:
        """The uid_quota/group_quota refusal of this request now (topod.alloc.quota), or
        None. Synchronous with the grant that follows it: nothing is granted in between."""
        return over_quota(self.quotas, caller, request.gpus, self.store.all)

    def _never(self, request) -> AllocationError | None:
        """The refusal no release could lift: the empty host's (topod.alloc.feasibility)."""
        from topod.alloc.feasibility import impossibility

        return impossibility(self.topology, self.distances, request, self.reserved_cpus, self.policy)

    def _final_refusal(self, request, refusal: AllocationError) -> AllocationError:
        """A refusal that says waiting may help, unless the empty host refuses too: then
        that one (retryable false), so no one waits or retries for what never comes."""
        if not getattr(refusal, "retryable", True) or refusal.code not in WAITABLE_CODES:
            return refusal
        return self._never(request) or refusal

    def telemetry_authority(self, caller: Caller) -> Callable[[Any], None] | None:
        """topod.service.lease_rules.telemetry_authority over the current leases."""
        return telemetry_authority(caller, self.store.all())

    async def allocate(self, body: Any, caller: Caller, connected: Callable[[], bool] = _always_connected) -> Lease:
        return await self.finish_allocation(self.start_allocation(body, caller), caller, connected)

    async def finish_allocation(self, started: tuple[Lease, asyncio.Future | None] | Queued, caller: Caller,
                                connected: Callable[[], bool] = _always_connected) -> Lease:
        """The lease start_allocation began: waited for (Queued), then delivered."""
        if isinstance(started, Queued):
            # Between the refusal and this (the API's hot path starts a task for it) leases
            # may have ended: then the queue is served at once, this request included.
            changed = started.free is not self.free_state()
            return await self._wait(started.request, started.service, caller, connected, recheck=changed)
        return await self._deliver(*started)

    def start_allocation(self, body: Any, caller: Caller) -> tuple[Lease, asyncio.Future | None] | Queued:
        """allocate's part that needs no waiting: a refusal raised, a grant made at once
        ((lease, commit): in the mirror now, on disk when commit resolves; the API's hot
        path answers from the commit, see deliver), or Queued: the request waits its turn
        (finish_allocation)."""
        if not caller.may_allocate:
            raise self._refuse("denied", PermissionDeniedError("only root and members of the topod group may allocate"),
                               caller)
        try:
            service, request = self.parse(body)
        except TopodError as exc:
            raise self._refuse("invalid", exc, caller) from None
        if service.owner_pid and not process_exists(service.owner_pid):
            raise self._refuse("invalid", InvalidRequestError("owner_pid", f"no process {service.owner_pid}"), caller)
        try:
            self._authorize(service, request, caller)
        except PermissionDeniedError as exc:
            raise self._refuse("denied", exc, caller, gpus=request.gpus, job=request.job) from None
        # The caps, the decision and the grant are one synchronous step: requests that
        # arrive together are judged one after the other, each seeing the grants before it.
        refusal = self._over_quota(request, caller)
        if refusal is None:
            try:
                decision = self.decide(request, ttl_seconds=service.ttl_seconds)
            except AllocationError as exc:
                refusal = exc
            else:
                return self._grant(request, decision, service, caller)
        refusal = self._final_refusal(request, refusal)
        if service.wait_seconds <= 0 or refusal.code not in WAITABLE_CODES or not getattr(refusal, "retryable", True):
            raise self._refuse("rejected", refusal, caller, gpus=request.gpus, job=request.job) from None
        return Queued(request, service, self.free_state())

    def deliver(self, lease: Lease, commit: asyncio.Future | None,
                answer: Callable[[Lease | None, BaseException | None], None]) -> None:
        """Once a granted lease is on disk and its files are written: answer(the lease as
        its answer shows it, None); if its commit or its files failed: answer(None, the
        error), the lease undone or ended. Callbacks on the loop, no task: the API's hot
        path answers from here, and then says whether the answer went out (answered())."""
        def current() -> Lease:  # the store's version: a confirmation may have come meanwhile
            return self.store.get(lease.id) or lease

        def files_written(written: asyncio.Future) -> None:
            if written.cancelled():
                error: BaseException | None = LeaseStoreError("the lease's files were not written (topod is stopping)")
            else:
                error = written.exception()
            if error is not None:
                self._take_back(lease, f"its files could not be written: {error}")
                answer(None, error)
            else:
                answer(current(), None)

        def committed(_: Lease | None, error: BaseException | None) -> None:
            if error is not None:
                answer(None, error)
            elif self.files is None or not self.files.lease_has_files(lease):
                answer(current(), None)
            else:
                written = asyncio.get_running_loop().run_in_executor(None, self.files.write_lease, lease)
                written.add_done_callback(files_written)

        self.when_committed(lease, commit, committed)

    async def _deliver(self, lease: Lease, commit: asyncio.Future | None) -> Lease:
        """Wait for the commit and the lease's files; a client gone meanwhile gets nothing,
        and the lease it would have had ends at once."""
        delivered = asyncio.get_running_loop().create_future()

        def answer(result: Lease | None, error: BaseException | None) -> None:
            if delivered.done():  # the client went away meanwhile (cancelled)
                return
            if error is not None:
                delivered.set_exception(error)
            else:
                delivered.set_result(result)

        self.deliver(lease, commit, answer)
        try:
            return await delivered
        except asyncio.CancelledError:
            self._take_back(lease)
            raise

    def _take_back(self, lease: Lease, reason: str = "client disconnected before the answer") -> None:
        current = self.store.get(lease.id)
        if current is not None:
            self._end(current, "lease_released", reason=reason)

    def answered(self, lease: Lease, delivered: bool) -> None:
        """The API's word on the answer that granted `lease`: written to a connected client,
        or not (the client went away, the write failed): then no one holds it and it ends."""
        if not delivered:
            self._take_back(lease, "the answer could not be delivered (client gone)")
            return
        commit = self.store.confirm(lease.id)
        self._after(commit, None, lambda exc: log.error("lease_not_stored", lease=lease.id, error=str(exc)))

    # -- ending and changing leases ------------------------------------------------
    def _refuse(self, result: str, error: TopodError, caller: Caller, **fields: Any) -> TopodError:
        """Count a refused request and say so in the journal (`request_rejected`); returns
        the error for the caller to raise."""
        code = getattr(error, "code", "error")
        self._count(result, code)
        self.bus.publish("request_rejected", result=result, code=code, reason=str(error)[:300], uid=caller.uid,
                         pid=caller.pid, **fields)
        return error

    def _refuse_change(self, request: str, result: str, error: TopodError, caller: Caller,
                       lease_id: str) -> TopodError:
        """A refused release/renew/revoke: `request_rejected` in the journal as a refused
        allocation is (not counted among allocation requests); returns the error."""
        self.bus.publish("request_rejected", request=request, result=result, code=getattr(error, "code", "error"),
                         reason=str(error)[:300], uid=caller.uid, pid=caller.pid, lease=lease_id[:100])
        return error

    def _count(self, result: str, reason: str = "") -> None:
        key = (result, reason)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
