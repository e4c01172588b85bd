"""The lease service: the engine's decisions carried out on durable leases.

Pure decisions come from topod.alloc (engine, policy, preemption); this shell owns
granting: parsing a request, the decision, the grant and its delivery, and serving the
requests that wait. It holds three parts and gives each only what it needs: an
EnvironmentBuilder (topod.service.lease_environment: the variables a lease comes with),
a WaitingQueue (topod.service.lease_queue: the waiters and their order) and a
LeaseLifecycle (topod.service.lease_lifecycle: release, revoke, renewal, preemption,
expiry, owner-process watching, recovery, the leases' fate when hardware changes). The
API, the daemon and the lease scopes call this class only. Every change goes through the
LeaseStore, whose group commit resolves a future once the change is on disk: callers
answer only after it. A waiting request belongs to its connection: when the client goes,
so does the request, and a grant made in that instant is taken back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

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
from topod.service.lease import Lease, new_id
from topod.service.lease_environment import EnvironmentBuilder, LeaseFiles
from topod.service.lease_lifecycle import LeaseLifecycle
from topod.service.lease_queue import (WAITABLE_CODES, Queued, QueuedRequestError, QueueFullError, WaitingQueue, Waiter,
                                       WaitTimeoutError, withdraw)
from topod.service.lease_rules import PermissionDeniedError, authorize_request, over_quota, telemetry_authority
from topod.service.lease_store import LeaseStore, LeaseStoreError
from topod.service.owner import OwnerWatch, process_exists, process_start_time
from topod.service.state import HostState

log = structlog.get_logger("topod")


def _always_connected() -> bool:
    return True


class LeaseService:
    def __init__(self, state: HostState, store: LeaseStore, bus: EventBus, settings: dict[str, Any],
                 reserved_cpus: set[int], clock: Callable[[], float] = time.time, pid_max: int = PID_MAX_LIMIT) -> None:
        self.pid_max = pid_max
        self.state = state
        self.store = store
        self.bus = bus
        self.clock = clock
        self.queue = WaitingQueue(bus)
        self.lifecycle = LeaseLifecycle(store, bus, clock, self._forget_files, self.process_queue)
        self.environments = EnvironmentBuilder()
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
    def waiters(self) -> list[Waiter]:
        """The requests waiting now, in the order they came."""
        return self.queue.waiters

    @property
    def owner_watch(self) -> OwnerWatch:
        return self.lifecycle.owner_watch

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
        self.lifecycle.after(commit, lambda: self._granted(lease), lambda exc: self._grant_failed(lease, exc))
        return lease, commit

    def environment(self, lease: Lease) -> dict[str, str]:
        """What a job needs to use its lease (topod.service.lease_environment)."""
        return self.environments.build(lease, self.topology, self._gpus_by_index(), self.files)

    def _forget_files(self, lease: Lease) -> None:
        """The lease has ended: its files go (before its end is published)."""
        if self.files is not None:
            self.files.remove_lease(lease)

    def _granted(self, lease: Lease) -> None:
        self._count("granted", lease.decision.level)
        self.bus.publish("lease_granted", lease=lease.id, gpus=list(lease.gpus), cpus=list(lease.cpus),
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
            # Between the refusal and this (a caller may start waiting a step later) leases
            # may have ended: then the queue is served at once, this request included.
            changed = started.free is not self.free_state()
            return await self._wait(started.request, started.service, caller, connected, recheck=changed)
        return await self._deliver(*started)

    def start_allocation(self, body: Any, caller: Caller) -> tuple[Lease, asyncio.Future | None] | Queued:
        """allocate's part that needs no waiting: a refusal raised, a grant made at once
        ((lease, commit): in the mirror now, on disk when commit resolves, see deliver), or
        Queued: the request waits its turn
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
        error), the lease undone or ended. Callbacks on the loop, no task; whoever answers
        the client then says whether the answer went out (answered())."""
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

        self.lifecycle.when_committed(lease, commit, committed)

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
            self.lifecycle.end(current, "lease_released", reason=reason)

    def answered(self, lease: Lease, delivered: bool) -> None:
        """The API's word on the answer that granted `lease`: written to a connected client,
        or not (the client went away, the write failed): then no one holds it and it ends."""
        if not delivered:
            self._take_back(lease, "the answer could not be delivered (client gone)")
            return
        commit = self.store.confirm(lease.id)
        self.lifecycle.after(commit, None, lambda exc: log.error("lease_not_stored", lease=lease.id, error=str(exc)))

    # -- held leases (topod.service.lease_lifecycle) ---------------------------------
    def get(self, lease_id: str) -> Lease:
        return self.lifecycle.get(lease_id)

    def owned(self, request: str, lease_id: str, caller: Caller) -> Lease:
        """The lease `caller` may change (its owner uid or root); refusals are logged."""
        return self.lifecycle.owned(request, lease_id, caller)

    async def release(self, lease_id: str, caller: Caller) -> Lease:
        return await self.lifecycle.release(lease_id, caller)

    def start_release(self, lease_id: str, caller: Caller) -> tuple[Lease, asyncio.Future | None]:
        """release's synchronous part: (the lease, the commit of its end); a refusal raised."""
        return self.lifecycle.start_release(lease_id, caller)

    def when_committed(self, lease: Lease, commit: asyncio.Future | None,
                       answer: Callable[[Lease | None, BaseException | None], None]) -> None:
        self.lifecycle.when_committed(lease, commit, answer)

    async def revoke(self, lease_id: str, caller: Caller, reason: str = "revoked by admin") -> Lease:
        return await self.lifecycle.revoke(lease_id, caller, reason)

    async def record_scope(self, lease_id: str, unit: str, enforcement: str) -> Lease | None:
        return await self.lifecycle.record_scope(lease_id, unit, enforcement)

    def scope_ended(self, lease_id: str, unit: str) -> Lease | None:
        return self.lifecycle.scope_ended(lease_id, unit)

    async def renew(self, lease_id: str, caller: Caller, ttl_seconds: float | None) -> Lease:
        """ttl_seconds: validated by the API (finite, > 0, within the cap); None renews with
        the lease's own ttl."""
        return await self.lifecycle.renew(lease_id, caller, ttl_seconds, self.limits.max_ttl_seconds)

    def reap(self) -> list[Lease]:
        """End expired leases, leases whose owner died, and preemptions past their deadline;
        drop waiters whose client is gone."""
        ended = self.lifecycle.reap()
        self.queue.cancel_disconnected()
        return ended

    def recover(self) -> int:
        """At start: every acknowledged lease is back; dead owners' and expired ones end, an
        unconfirmed one gets [alloc] unconfirmed_grace_seconds (LeaseLifecycle.recover)."""
        ended = self.reap()
        self.lifecycle.recover(float(self.settings.get("unconfirmed_grace_seconds", 300.0)), self.topology)
        return len(ended)

    def _state_changed(self, kind: str) -> None:
        if kind == "hardware":
            self.lifecycle.check_devices(self.topology)
        self.process_queue()

    # -- requests that wait (the queue: topod.service.lease_queue) ----------------------
    async def _wait(self, request, service: ServiceRequest, caller: Caller, connected: Callable[[], bool],
                    recheck: bool = False) -> Lease:
        if len(self.queue.waiters) >= int(self.settings.get("max_queue", 256)):
            raise self._refuse("queue_full", QueueFullError(f"{len(self.queue.waiters)} requests already waiting; "
                                                            "try again later"), caller, gpus=request.gpus, job=request.job)
        waiter = self.queue.join(request, service, caller, self.clock(), connected)
        if recheck:
            self.process_queue()
        if not waiter.future.done():
            self._maybe_preempt(waiter)
        try:
            async with asyncio.timeout(service.wait_seconds):
                lease, commit = await asyncio.shield(waiter.future)
        except TimeoutError:
            # The deadline and a grant can meet: process_queue may have granted in the very
            # step the timeout fired. Withdrawing and reading the grant is one step (no await
            # between them), so either the waiter is withdrawn and refused, or it was granted
            # and this still-connected client is told so: never a lease nobody was told of.
            granted = withdraw(waiter)
            if granted is None:
                self._drop_waiter(waiter)
                over = self._over_quota(request, caller)
                what = "GPUs" if request.gpus else "CPUs"  # a lease without GPUs waits for CPUs
                why = f"{over}; no room within" if over is not None else f"no {what} became available within"
                raise self._refuse("timeout", WaitTimeoutError(f"{why} {service.wait_seconds:g} s"), caller,
                                   gpus=request.gpus, job=request.job, request=waiter.id) from None
            lease, commit = granted
        except BaseException as exc:
            # The client hung up (cancelled) or the request failed: a grant made for it in
            # the meantime is taken back.
            granted = withdraw(waiter)
            if granted is not None:
                self._take_back(granted[0])
            self._drop_waiter(waiter)
            if isinstance(exc, asyncio.CancelledError):
                self._count("abandoned", "client_disconnected")
                self.bus.publish("request_abandoned", request=waiter.id, reason="client disconnected")
            raise
        self._drop_waiter(waiter)
        return await self._deliver(lease, commit)

    def _drop_waiter(self, waiter: Waiter) -> None:
        """Out of the queue; the leases preempted for it are active again."""
        self.lifecycle.cancel_preemption(self.queue.leave(waiter), waiter.id)

    def process_queue(self) -> None:
        """Grant waiting requests that now fit, highest effective priority first; only to
        clients still connected. A waiter over its GPU cap waits on (its own releases make
        room); one that can never be served now (the config or the hardware changed since
        it came: a cap below its size, GPUs gone) is answered at once with that refusal."""
        now = self.clock()
        for waiter in self.queue.serving(now, self.policy):
            over = self._over_quota(waiter.request, waiter.caller)
            if over is not None:
                if not over.retryable:
                    self._answer_refusal(waiter, over)
                continue
            try:
                decision = self.decide(waiter.request, waited=now - waiter.enqueued,
                                       ttl_seconds=waiter.service.ttl_seconds)
                lease, commit = self._grant(waiter.request, decision, waiter.service, waiter.caller)
            except AllocationError as exc:
                final = self._final_refusal(waiter.request, exc)
                if not getattr(final, "retryable", True):
                    self._answer_refusal(waiter, final)
                continue
            except Exception as exc:  # noqa: BLE001 - one waiter's fault is its own, never the releasing client's
                log.error("queued_request_failed", request=waiter.id, error=f"{type(exc).__name__}: {exc}")
                waiter.future.set_exception(exc if isinstance(exc, TopodError) else
                                            QueuedRequestError(f"the queued request failed: {type(exc).__name__}: "
                                                               f"{exc}"))
                continue
            waiter.victims = ()
            waiter.future.set_result((lease, commit))

    def _answer_refusal(self, waiter: Waiter, refusal: AllocationError) -> None:
        """A waiter that no release can serve: refused now (counted and logged as a refusal
        at the door is), not at its timeout."""
        request = waiter.request
        waiter.future.set_exception(self._refuse("rejected", refusal, waiter.caller, gpus=request.gpus,
                                                 job=request.job, request=waiter.id))

    def _maybe_preempt(self, waiter: Waiter) -> None:
        from topod.alloc.preemption import plan_preemption

        if self._over_quota(waiter.request, waiter.caller) is not None:
            return  # its own leases stand in its way: no one else's is taken for it

        victims = plan_preemption(self.topology, self.distances, self.free_state(), waiter.request,
                                  [lease for lease in self.store.all() if lease.state == "active"], self.policy)
        if not victims:
            return
        deadline = self.clock() + float(self.settings.get("preemption_grace_seconds", 300.0))
        self.lifecycle.preempt(victims, deadline, waiter.id)
        waiter.victims = tuple(lease.id for lease in victims)

    # -- refusals, counted ------------------------------------------------------------
    def _refuse(self, result: str, error: TopodError, caller: Caller, **fields: Any) -> TopodError:
        """Count a refused request and say so in the journal (`request_rejected`); returns
        the error for the caller to raise."""
        code = getattr(error, "code", "error")
        self._count(result, code)
        self.bus.publish("request_rejected", result=result, code=code, reason=str(error)[:300], uid=caller.uid,
                         pid=caller.pid, **fields)
        return error

    def _count(self, result: str, reason: str = "") -> None:
        key = (result, reason)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
