"""Held leases (a mixin of topod.service.leases.LeaseService): what happens to a lease
after its grant. Release and revoke, renewal, its systemd scope, ending it (the change,
its commit, its events and files), reaping the expired, the abandoned and those whose
owner process exited, recovery after a crash, and the leases' fate when hardware
changes. Every change goes through the LeaseStore and is answered once on disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import structlog

from topod.alloc.errors import InvalidRequestError
from topod.api.peer import Caller
from topod.errors import TopodError
from topod.service.lease import Lease
from topod.service.lease_rules import PermissionDeniedError
from topod.service.lease_store import LeaseStoreError
from topod.service.owner import process_exists, process_start_time

log = structlog.get_logger("topod")


class LeaseNotFoundError(TopodError):
    code = "lease_not_found"


class LeaseLifecycle:
    def get(self, lease_id: str) -> Lease:
        lease = self.store.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError(f"no lease {lease_id!r}")
        return lease

    def _owned(self, request: str, lease_id: str, caller: Caller) -> Lease:
        """The lease `caller` may release or renew; a refusal (404, 403) is logged."""
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
        lease = self._owned("release", lease_id, caller)
        return self._end(lease, "lease_released", reason="released")

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
        return await self._committed(self._end(lease, "lease_revoked", reason=reason))

    # -- a lease's systemd scope (topod.service.lease_scope) ---------------------------
    def owned(self, request: str, lease_id: str, caller: Caller) -> Lease:
        """The lease `caller` may change (its owner uid or root); refusals are logged."""
        return self._owned(request, lease_id, caller)

    async def record_scope(self, lease_id: str, unit: str, enforcement: str) -> Lease | None:
        """The lease now has its job in `unit`, held as `enforcement` says; None if it ended meanwhile."""
        lease = self.store.get(lease_id)
        if lease is None:
            return None
        commit = self._update(replace(lease, scope=unit, enforcement=enforcement))
        if commit is not None:
            await asyncio.shield(commit)
        return self.store.get(lease_id)

    def scope_ended(self, lease_id: str, unit: str) -> Lease | None:
        """The lease's scope is gone (its last process exited, or it was stopped): the lease ends."""
        lease = self.store.get(lease_id)
        return None if lease is None else self._end(lease, "lease_released", reason=f"scope {unit} ended")[0]

    async def renew(self, lease_id: str, caller: Caller, ttl_seconds: float | None) -> Lease:
        """ttl_seconds: validated by the API (finite, > 0, within the cap); None renews with
        the lease's own ttl."""
        lease = self._owned("renew", lease_id, caller)
        ttl = lease.ttl_seconds if ttl_seconds is None else ttl_seconds
        if ttl is None and not lease.confirmed:
            # A lease brought back unconfirmed after a crash: its holder says it has it.
            renewed = replace(lease, expires=None, confirmed=True)
        elif ttl is None:
            raise self._refuse_change("renew", "invalid", InvalidRequestError(
                "ttl_seconds", "this lease has no ttl; give one to renew"), caller, lease_id)
        else:
            ttl = min(float(ttl), self.limits.max_ttl_seconds)
            renewed = replace(lease, expires=self.clock() + ttl, ttl_seconds=ttl, confirmed=True)
        commit = self._update(renewed)
        if commit is not None:
            await asyncio.shield(commit)
        self.bus.publish("lease_renewed", lease=lease_id, expires=renewed.expires)
        return self.store.get(lease_id) or renewed

    async def _committed(self, ended: tuple[Lease, asyncio.Future | None]) -> Lease:
        lease, commit = ended
        if commit is not None:
            await asyncio.shield(commit)
        return lease

    def _update(self, lease: Lease) -> asyncio.Future | None:
        commit = self.store.update(lease)
        self._after(commit, None, lambda exc: log.error("lease_not_stored", lease=lease.id, error=str(exc)))
        return commit

    def _end(self, lease: Lease, event: str, reason: str) -> tuple[Lease, asyncio.Future | None]:
        removed = self.store.remove(lease.id)
        if removed is None:
            return lease, None
        lease, commit = removed
        self.owner_watch.unwatch(lease.id)

        def ended() -> None:
            if self.files is not None:
                self.files.remove_lease(lease)
            self.bus.publish(event, lease=lease.id, gpus=list(lease.gpus), reason=reason, uid=lease.owner_uid)
            # Only now are its GPUs free (the store holds them until the delete is on disk).
            self.process_queue()

        def not_ended(exc: BaseException) -> None:
            # The store has put the lease back as it is on disk: it still holds its GPUs.
            log.error("lease_end_not_stored", lease=lease.id, error=str(exc), reason=reason)
            if lease.owner_pid and self.store.get(lease.id) is not None:
                self.owner_watch.watch(lease.id, lease.owner_pid)

        self._after(commit, ended, not_ended)
        return lease, commit

    def _after(self, commit: asyncio.Future | None, ok: Callable[[], None] | None,
               failed: Callable[[BaseException], None]) -> None:
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

    def _owner_exited(self, lease_id: str) -> None:
        lease = self.store.get(lease_id)
        if lease is not None:
            self._end(lease, "lease_released", reason=f"owner process {lease.owner_pid} exited")

    def reap(self) -> list[Lease]:
        """End expired leases, leases whose owner died, and preemptions past their deadline;
        drop waiters whose client is gone."""
        now = self.clock()
        ended = []
        for lease in self.store.all():
            if lease.expires is not None and lease.expires <= now:
                ended.append(self._end(lease, "lease_released", reason="ttl expired")[0])
            elif lease.owner_pid and not _owner_alive(lease):
                ended.append(self._end(lease, "lease_released",
                                       reason=f"owner process {lease.owner_pid} exited")[0])
            elif lease.state == "preempting" and lease.preempt_deadline is not None and lease.preempt_deadline <= now:
                ended.append(self._end(lease, "lease_revoked", reason="preemption grace period over")[0])
        for waiter in list(self.waiters):
            if not waiter.future.done() and not waiter.connected():
                waiter.future.cancel()
        return ended

    def recover(self) -> int:
        """At start: every acknowledged lease is back; dead owners' and expired ones end.

        A lease with neither ttl nor owner whose answer was never confirmed written (topod
        died between the commit and the answer) may be known to no one: it gets
        [alloc] unconfirmed_grace_seconds to be claimed by its holder (a renew, which
        confirms it) and ends after that, rather than holding its GPUs for ever."""
        ended = self.reap()
        grace = float(self.settings.get("unconfirmed_grace_seconds", 300.0))
        for lease in self.store.all():
            if not lease.confirmed and lease.expires is None:
                expires = self.clock() + grace
                self._update(replace(lease, expires=expires))
                log.warning("lease_unconfirmed", lease=lease.id, gpus=list(lease.gpus), uid=lease.owner_uid,
                            job=lease.job, expires=expires,
                            reason="granted just before topod stopped; the answer may never have reached the "
                                   "client. It ends at 'expires' unless its holder renews it")
        for lease in self.store.all():
            if lease.owner_pid:
                self.owner_watch.watch(lease.id, lease.owner_pid)
        self._check_devices()
        return len(ended)

    # -- hardware changes -----------------------------------------------------------
    def _state_changed(self, kind: str) -> None:
        if kind == "hardware":
            self._check_devices()
        self.process_queue()

    def _check_devices(self) -> None:
        """A lease whose GPU vanished (hot-unplug, unbind, another host under the same
        state dir) turns degraded, visibly; it turns active again when the GPU returns."""
        present = {gpu.index: gpu.address for gpu in self.topology.gpus}
        for lease in self.store.all():
            missing = tuple(p.index for p in lease.decision.placements if present.get(p.index) != p.address)
            if missing == lease.missing_gpus:
                continue
            if missing:
                state = "degraded" if lease.state == "active" else lease.state
                self._update(replace(lease, state=state, missing_gpus=missing))
                self.bus.publish("lease_degraded", lease=lease.id, missing_gpus=list(missing),
                                 addresses=[p.address for p in lease.decision.placements if p.index in missing])
            else:
                state = "active" if lease.state == "degraded" else lease.state
                self._update(replace(lease, state=state, missing_gpus=()))
                self.bus.publish("lease_restored", lease=lease.id, gpus=list(lease.gpus))


def _owner_alive(lease: Lease) -> bool:
    if not process_exists(lease.owner_pid):
        return False
    recorded = lease.owner_start_time
    current = process_start_time(lease.owner_pid)
    # A recycled pid has another start time: the owner is gone.
    return recorded is None or current is None or abs(recorded - current) < 1.0
