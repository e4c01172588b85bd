"""Held leases: what happens to a lease after its grant. Release and revoke, renewal, its
systemd scope, preemption on a waiting request's behalf, ending it (the change, its commit,
its events and files), reaping the expired and those whose owner process exited, recovery
after a crash, and the leases' fate when hardware changes. Every change goes through the
LeaseStore and is answered once on disk. The lease service (topod.service.leases) holds a
LeaseLifecycle and gives it the store, the event bus and the clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from topod.alloc.errors import InvalidRequestError
from topod.api.peer import Caller
from topod.errors import TopodError
from topod.events import EventBus
from topod.service.lease import Lease
from topod.service.lease_rules import PermissionDeniedError
from topod.service.lease_store import LeaseStore, LeaseStoreError
from topod.service.owner import OwnerWatch, process_exists, process_start_time

log = structlog.get_logger("topod")


class LeaseNotFoundError(TopodError):
    code = "lease_not_found"


class LeaseLifecycle:
    """Held leases, from their grant to their end. Owns the watch on owner processes; told
    by the lease service how to forget a lease's files (`forget_files`, before its end is
    published) and called back once a lease's GPUs are free (`freed`: the queue is served)."""

    def __init__(self, store: LeaseStore, bus: EventBus, clock: Callable[[], float],
                 forget_files: Callable[[Lease], None], freed: Callable[[], None]) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self._forget_files = forget_files
        self._freed = freed
        self.owner_watch = OwnerWatch(self.owner_exited)

    def get(self, lease_id: str) -> Lease:
        lease = self.store.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(f"no lease {lease_id!r}")
        return lease

    def owned(self, request: str, lease_id: str, caller: Caller) -> Lease:
        """The lease `caller` may release, renew or change (its owner uid or root); a
        refusal (404, 403) is logged."""
        try:
            lease = self.get(lease_id)
        except LeaseNotFoundError as exc:
            raise self._refuse_change(request, "not_found", exc, caller, lease_id) from None
        if not (caller.is_admin or caller.uid == lease.owner_uid):
            raise self._refuse_change(request, "denied", PermissionDeniedError(
                f"lease {lease_id} belongs to uid {lease.owner_uid}"), caller, lease_id)
        return lease

    async def release(self, lease_id: str, caller: Caller) -> Lease:
        return await self._committed(self.start_release(lease_id, caller))

    def start_release(self, lease_id: str, caller: Caller) -> tuple[Lease, asyncio.Future | None]:
        """release's synchronous part: (the lease, the commit of its end); a refusal raised."""
        lease = self.owned("release", lease_id, caller)
        return self.end(lease, "lease_released", reason="released")

    def when_committed(self, lease: Lease, commit: asyncio.Future | None,
                       answer: Callable[[Lease | None, BaseException | None], None]) -> None:
        """answer(lease, None) once a change to it is on disk; answer(None, the error) if
        its commit failed (the change undone). A callback on the loop, no task."""
        def committed(done: asyncio.Future) -> None:
            if done.cancelled():
                answer(None, LeaseStoreError("the commit was abandoned (topod is stopping)"))
            elif done.exception() is not None:
                answer(None, done.exception())
            else:
                answer(lease, None)

        if commit is None:
            answer(lease, None)
        else:
            self.store.on_commit(commit, committed)

    async def revoke(self, lease_id: str, caller: Caller, reason: str = "revoked by admin") -> Lease:
        if not caller.is_admin:
            raise self._refuse_change("revoke", "denied", PermissionDeniedError("revoking a lease is root-only"),
                                      caller, lease_id)
        try:
            lease = self.get(lease_id)
        except LeaseNotFoundError as exc:
            raise self._refuse_change("revoke", "not_found", exc, caller, lease_id) from None
        return await self._committed(self.end(lease, "lease_revoked", reason=reason))

    # -- a lease's systemd scope (topod.service.lease_scope) ---------------------------
    async def record_scope(self, lease_id: str, unit: str, enforcement: str) -> Lease | None:
        """The lease now has its job in `unit`, held as `enforcement` says; None if it ended meanwhile."""
        lease = self.store.get(lease_id)
        if lease is None:
            return None
        commit = self.update(replace(lease, scope=unit, enforcement=enforcement))
        if commit is not None:
            await asyncio.shield(commit)
        return self.store.get(lease_id)

    def scope_ended(self, lease_id: str, unit: str) -> Lease | None:
        """The lease's scope is gone (its last process exited, or it was stopped): the lease ends."""
        lease = self.store.get(lease_id)
        return None if lease is None else self.end(lease, "lease_released", reason=f"scope {unit} ended")[0]

    async def renew(self, lease_id: str, caller: Caller, ttl_seconds: float | None, max_ttl_seconds: float) -> Lease:
        """ttl_seconds: validated by the API (finite, > 0, within the cap); None renews with
        the lease's own ttl. max_ttl_seconds: [alloc] renew_max_ttl_seconds."""
        lease = self.owned("renew", lease_id, caller)
        ttl = lease.ttl_seconds if ttl_seconds is None else ttl_seconds
        if ttl is None and not lease.confirmed:
            # A lease brought back unconfirmed after a crash: its holder says it has it.
            renewed = replace(lease, expires=None, confirmed=True)
        elif ttl is None:
            raise self._refuse_change("renew", "invalid", InvalidRequestError(
                "ttl_seconds", "this lease has no ttl; give one to renew"), caller, lease_id)
        else:
            ttl = min(float(ttl), max_ttl_seconds)
            renewed = replace(lease, expires=self.clock() + ttl, ttl_seconds=ttl, confirmed=True)
        commit = self.update(renewed)
        if commit is not None:
            await asyncio.shield(commit)
        self.bus.publish("lease_renewed", lease=lease_id, expires=renewed.expires)
        return self.store.get(lease_id) or renewed

    def _refuse_change(self, request: str, result: str, error: TopodError, caller: Caller,
                       lease_id: str) -> TopodError:
        """A refused release/renew/revoke: `request_rejected` in the journal as a refused
        allocation is (not counted among allocation requests); returns the error."""
        self.bus.publish("request_rejected", request=request, result=result, code=getattr(error, "code", "error"),
                         reason=str(error)[:300], uid=caller.uid, pid=caller.pid, lease=lease_id[:100])
        return error

    # -- changing and ending leases ----------------------------------------------------
    async def _committed(self, ended: tuple[Lease, asyncio.Future | None]) -> Lease:
        lease, commit = ended
        if commit is not None:
            await asyncio.shield(commit)
        return lease

    def update(self, lease: Lease) -> asyncio.Future | None:
        commit = self.store.update(lease)
        self.after(commit, None, lambda exc: log.error("lease_not_stored", lease=lease.id, error=str(exc)))
        return commit

    def end(self, lease: Lease, event: str, reason: str) -> tuple[Lease, asyncio.Future | None]:
        removed = self.store.remove(lease.id)
        if removed is None:
            return lease, None
        lease, commit = removed
        self.owner_watch.unwatch(lease.id)

        def ended() -> None:
            self._forget_files(lease)
            self.bus.publish(event, lease=lease.id, gpus=list(lease.gpus), reason=reason, uid=lease.owner_uid)
            # Only now are its GPUs free (the store holds them until the delete is on disk).
            self._freed()

        def not_ended(exc: BaseException) -> None:
            # The store has put the lease back as it is on disk: it still holds its GPUs.
            log.error("lease_end_not_stored", lease=lease.id, error=str(exc), reason=reason)
            if lease.owner_pid and self.store.get(lease.id) is not None:
                self.owner_watch.watch(lease.id, lease.owner_pid)

        self.after(commit, ended, not_ended)
        return lease, commit

    def after(self, commit: asyncio.Future | None, ok: Callable[[], None] | None,
              failed: Callable[[BaseException], None]) -> None:
        """ok() once `commit` is on disk (at once without one), failed(error) if it failed."""
        if commit is None:
            if ok is not None:
                ok()
            return

        def done(future: asyncio.Future) -> None:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is not None:
                failed(exc)
            elif ok is not None:
                ok()

        self.store.on_commit(commit, done)

    # -- preemption on a waiting request's behalf ----------------------------------------
    def preempt(self, victims: list[Lease], deadline: float, request_id: str) -> None:
        """Ask each victim to give its GPUs back by `deadline` (it turns preempting)."""
        for lease in victims:
            self.update(replace(lease, state="preempting", preempt_deadline=deadline))
            self.bus.publish("preemption_requested", lease=lease.id, deadline=deadline, request=request_id,
                             gpus=list(lease.gpus), uid=lease.owner_uid)

    def cancel_preemption(self, lease_ids: tuple[str, ...], request_id: str) -> None:
        """The request they were preempted for is gone: victims still preempting are active again."""
        for lease_id in lease_ids:
            lease = self.store.get(lease_id)
            if lease is not None and lease.state == "preempting":
                self.update(replace(lease, state="active", preempt_deadline=None))
                self.bus.publish("preemption_cancelled", lease=lease_id, request=request_id)

    # -- the leases that end on their own -----------------------------------------------
    def owner_exited(self, lease_id: str) -> None:
        lease = self.store.get(lease_id)
        if lease is not None:
            self.end(lease, "lease_released", reason=f"owner process {lease.owner_pid} exited")

    def reap(self) -> list[Lease]:
        """End expired leases, leases whose owner died, and preemptions past their deadline."""
        now = self.clock()
        ended = []
        for lease in self.store.all():
            if lease.expires is not None and lease.expires <= now:
                ended.append(self.end(lease, "lease_released", reason="ttl expired")[0])
            elif lease.owner_pid and not _owner_alive(lease):
                ended.append(self.end(lease, "lease_released",
                                      reason=f"owner process {lease.owner_pid} exited")[0])
            elif lease.state == "preempting" and lease.preempt_deadline is not None and lease.preempt_deadline <= now:
                ended.append(self.end(lease, "lease_revoked", reason="preemption grace period over")[0])
        return ended

    def recover(self, unconfirmed_grace_seconds: float, topology: Any) -> None:
        """At start, after the reap: every acknowledged lease is back and watched.

        A lease with neither ttl nor owner whose answer was never confirmed written (topod
        died between the commit and the answer) may be known to no one: it gets
        [alloc] unconfirmed_grace_seconds to be claimed by its holder (a renew, which
        confirms it) and ends after that, rather than holding its GPUs for ever."""
        for lease in self.store.all():
            if not lease.confirmed and lease.expires is None:
                expires = self.clock() + unconfirmed_grace_seconds
                self.update(replace(lease, expires=expires))
                log.warning("lease_unconfirmed", lease=lease.id, gpus=list(lease.gpus), uid=lease.owner_uid,
                            job=lease.job, expires=expires,
                            reason="granted just before topod stopped; the answer may never have reached the "
                                   "client. It ends at 'expires' unless its holder renews it")
        for lease in self.store.all():
            if lease.owner_pid:
                self.owner_watch.watch(lease.id, lease.owner_pid)
        self.check_devices(topology)

    # -- hardware changes -----------------------------------------------------------
    def check_devices(self, topology: Any) -> None:
        """A lease whose GPU vanished (hot-unplug, unbind, another host under the same
        state dir) turns degraded, visibly; it turns active again when the GPU returns."""
        present = {gpu.index: gpu.address for gpu in topology.gpus}
        for lease in self.store.all():
            missing = tuple(p.index for p in lease.decision.placements if present.get(p.index) != p.address)
            if missing == lease.missing_gpus:
                continue
            if missing:
                state = "degraded" if lease.state == "active" else lease.state
                self.update(replace(lease, state=state, missing_gpus=missing))
                self.bus.publish("lease_degraded", lease=lease.id, missing_gpus=list(missing),
                                 addresses=[p.address for p in lease.decision.placements if p.index in missing])
            else:
                state = "active" if lease.state == "degraded" else lease.state
                self.update(replace(lease, state=state, missing_gpus=()))
                self.bus.publish("lease_restored", lease=lease.id, gpus=list(lease.gpus))


def _owner_alive(lease: Lease) -> bool:
    if not process_exists(lease.owner_pid):
        return False
    recorded = lease.owner_start_time
    current = process_start_time(lease.owner_pid)
    # A recycled pid has another start time: the owner is gone.
    return recorded is None or current is None or abs(recorded - current) < 1.0
