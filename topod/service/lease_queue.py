"""Requests that wait for a lease: the WaitingQueue (its waiters, the order they are served
in, joining and leaving it, taking one out of the running) and what a waiter is. Waiting is
a request's second life, after the grant path refused it: a request granted at once never
comes here. The lease service (topod.service.leases) holds the queue and drives it: it
decides and grants for the waiters the queue hands it, and asks its lifecycle to preempt
on a waiter's behalf; the queue itself grants nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from topod.alloc.policy import PolicySettings, effective_priority
from topod.alloc.request import FreeState
from topod.alloc.service_request import ServiceRequest
from topod.api.peer import Caller
from topod.errors import AllocationError, TopodError
from topod.events import EventBus
from topod.service.lease import Lease, new_id

# Refusals a request may wait out (with a wait) when they are retryable; any other is
# final. A quota refusal waits for the holder's own releases (topod.alloc.quota).
WAITABLE_CODES = ("insufficient_gpus", "level_unreachable", "insufficient_cpus", "insufficient_nics", "uid_quota",
                  "group_quota")


class QueueFullError(TopodError):
    code = "queue_full"


class WaitTimeoutError(AllocationError):
    code = "wait_timeout"


class QueuedRequestError(TopodError):
    code = "internal_error"


@dataclass(slots=True)
class Waiter:
    request: Any
    service: ServiceRequest
    caller: Caller
    enqueued: float
    future: asyncio.Future  # resolves to (Lease, commit future)
    connected: Callable[[], bool]
    victims: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: new_id(12))


@dataclass(frozen=True, slots=True)
class Queued:
    """A request that cannot be granted now and may wait (start_allocation's answer)."""

    request: Any
    service: ServiceRequest
    free: FreeState  # what was taken when it was refused


def serving_order(waiters: list[Waiter], now: float, policy: PolicySettings) -> list[Waiter]:
    """Highest effective priority first (priority plus aging); the queue's order among equals."""
    return sorted(waiters, key=lambda w: -effective_priority(
        w.request.priority, now - w.enqueued, policy.aging_seconds, policy.max_aging_boost))


def withdraw(waiter: Waiter) -> tuple[Lease, asyncio.Future | None] | None:
    """Take a waiter out of the running for grants and say whether it was granted first:
    (lease, commit) when it was, None when it now never will be. Synchronous on the loop,
    so no grant can slip in between the look and the cancel."""
    future = waiter.future
    if not future.done():
        future.cancel()
        return None
    if future.cancelled() or future.exception() is not None:
        return None
    return future.result()


class WaitingQueue:
    """The waiters, in the order they came; `serving` gives them in the order they are served."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.waiters: list[Waiter] = []

    def join(self, request: Any, service: ServiceRequest, caller: Caller, now: float,
             connected: Callable[[], bool]) -> Waiter:
        """A new waiter at the back of the queue (its future resolves to (lease, commit))."""
        waiter = Waiter(request, service, caller, now, asyncio.get_running_loop().create_future(), connected)
        self.waiters.append(waiter)
        self.bus.publish("request_queued", request=waiter.id, gpus=request.gpus, priority=request.priority,
                         uid=caller.uid, job=request.job, wait=service.wait_seconds)
        return waiter

    def leave(self, waiter: Waiter) -> tuple[str, ...]:
        """The waiter is out of the queue; returns the leases preempted for it (now no one's victims)."""
        if waiter in self.waiters:
            self.waiters.remove(waiter)
        victims, waiter.victims = waiter.victims, ()
        return victims

    def serving(self, now: float, policy: PolicySettings) -> Iterator[Waiter]:
        """The waiters still to be served, highest effective priority first, each looked at
        when its turn comes (a grant before it may have changed its lot); a waiter whose
        client is gone is cancelled on the way (its request withdraws itself)."""
        for waiter in serving_order(self.waiters, now, policy):
            if waiter.future.done():
                continue
            if not waiter.connected():
                waiter.future.cancel()
                continue
            yield waiter

    def cancel_disconnected(self) -> None:
        """Cancel every waiter whose client is gone (the reaper's sweep)."""
        for waiter in list(self.waiters):
            if not waiter.future.done() and not waiter.connected():
                waiter.future.cancel()
