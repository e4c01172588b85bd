"""A change queued for the lease database (topod.service.lease_writer): its statements,
its undo, the future its caller waits on, and how it is settled on its event loop once
its batch is written: resolved (after its on_success), or undone and failed with the
error a client is shown.

Its own module because settling is the loop's side of a commit: the writer decides when
a batch is written and by whom; what a written or failed change does to the mirror and
to whoever waits on it is the same either way.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from topod.errors import TopodError
from topod.service.lease_db import LeaseConflictError, LeaseStoreError


@dataclass(slots=True)
class QueuedChange:
    sql: list[tuple[str, tuple | list]]  # statements; executemany when params is a list
    undo: Callable[[], None]
    future: asyncio.Future | None
    loop: asyncio.AbstractEventLoop | None
    error: BaseException | None = field(default=None)
    written: threading.Event | None = None  # set once the op's batch is written (flush)
    on_success: Callable[[], None] | None = None  # on the loop, once the change is on disk
    then: list[Callable[[asyncio.Future], None]] | None = None  # on_commit's callbacks


def settle(op: QueuedChange) -> None:
    """On the change's loop, once its batch is written: resolved (its on_success first),
    or undone and failed; then its on_commit callbacks, each fault reported and the next
    one still run. A change no one waits on (no future) has nothing to settle."""
    future = op.future
    if future is None:
        return
    if op.error is None:
        if op.on_success is not None:
            op.on_success()
        if not future.done():
            future.set_result(None)
    else:
        op.undo()
        if not future.done():
            future.set_exception(failure_of(op.error))
    for callback in op.then or ():
        try:
            callback(future)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - as asyncio's Handle: reported, the rest of the batch settles
            op.loop.call_exception_handler({"message": "lease store: an on_commit callback failed",
                                            "exception": exc, "future": future})


def failure_of(error: BaseException) -> TopodError:
    """What a client is told of a failed change: a constraint is a conflict (the GPU is
    leased already), anything else a failed write."""
    if isinstance(error, sqlite3.IntegrityError):
        return LeaseConflictError(f"refused by the lease database: {error}")
    return LeaseStoreError(f"lease database write failed, change undone: {error}")
