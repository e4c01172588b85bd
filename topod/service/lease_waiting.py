"""Requests that wait for a lease (a mixin of topod.service.leases.LeaseService): joining
the queue, being served from it when leases end or settings change, leaving it (granted,
timed out, or the client gone, a grant made meanwhile taken back) and gentle preemption on
a waiter's behalf. Its own module because waiting is a request's second life, after the
grant path refused it: a request granted at once never comes here. The queue's parts that
need nothing of the service (a waiter, the serving order, withdrawal) are
topod.service.lease_queue's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import structlog

from topod.alloc.service_request import ServiceRequest
from topod.api.peer import Caller
from topod.errors import AllocationError, TopodError
from topod.service.lease import Lease
from topod.service.lease_queue import (QueuedRequestError, QueueFullError, Waiter, WaitTimeoutError, serving_order,
                                       withdraw)

log = structlog.get_logger("topod")


class LeaseWaiting:
    async def _wait(self, request, service: ServiceRequest, caller: Caller, connected: Callable[[], bool],
                    recheck: bool = False) -> Lease:
        if len(self.waiters) >= int(self.settings.get("max_queue", 256)):
            raise self._refuse("queue_full", QueueFullError(f"{len(self.waiters)} requests already waiting; "
                                                            "try again later"), caller, gpus=request.gpus, job=request.job)
        waiter = Waiter(request, service, caller, self.clock(), asyncio.get_running_loop().create_future(), connected)
        self.waiters.append(waiter)
        self.bus.publish("request_queued", request=waiter.id, gpus=request.gpus, priority=request.priority,
                         uid=caller.uid, job=request.job, wait=service.wait_seconds)
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
        if waiter in self.waiters:
            self.waiters.remove(waiter)
        for lease_id in waiter.victims:
            lease = self.store.get(lease_id)
            if lease is not None and lease.state == "preempting":
                self._update(replace(lease, state="active", preempt_deadline=None))
                self.bus.publish("preemption_cancelled", lease=lease_id, request=waiter.id)
        waiter.victims = ()

    def process_queue(self) -> None:
        """Grant waiting requests that now fit, highest effective priority first; only to
        clients still connected. A waiter over its GPU cap waits on (its own releases make
        room); one that can never be served now (the config or the hardware changed since
        it came: a cap below its size, GPUs gone) is answered at once with that refusal."""
        now = self.clock()
        for waiter in serving_order(self.waiters, now, self.policy):
            if waiter.future.done():
                continue
            if not waiter.connected():
                waiter.future.cancel()
                continue
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
        for lease in victims:
            self._update(replace(lease, state="preempting", preempt_deadline=deadline))
            self.bus.publish("preemption_requested", lease=lease.id, deadline=deadline, request=waiter.id,
                             gpus=list(lease.gpus), uid=lease.owner_uid)
        waiter.victims = tuple(lease.id for lease in victims)
