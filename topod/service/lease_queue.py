"""Requests that wait for GPUs: a waiter, the order waiters are served in, and taking
one out of the running. The lease service (topod.service.leases) owns the queue and
grants from it; these are its parts that need nothing of the service."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topod.alloc.policy import PolicySettings, effective_priority
from topod.alloc.request import FreeState
from topod.alloc.service_request import ServiceRequest
from topod.api.peer import Caller
from topod.errors import AllocationError, TopodError
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
