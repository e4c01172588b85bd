"""The lease store's writer: one thread that owns the database and commits in groups.

Every change queued while a commit is running goes into the next transaction, so
concurrent grants and releases share one fsync (WAL, synchronous=FULL). Each change comes
with its undo and gets a future that resolves, on its event loop, when the transaction
holding it is on disk; a failed commit undoes its changes (topod.service.lease_store's
mirror changed at once, before they were queued) and fails their futures.

A change that waits alone, on a writer that is idle, is committed by the event loop
itself once its turn is over: the two hand-offs between threads (waking the writer, then
waking the loop with the result) cost ~60 us each on a VM, a fifth of a grant's answer,
while the loop had nothing else to do but wait. Only while commits are fast (their recent
average under LOOP_COMMIT_UNDER_SECONDS): a slow or stalling disk holds the loop for one
commit at most, and then every change goes to the thread again. Batches of several
changes (load) and commits with a checkpoint due stay the thread's, so the loop goes on
serving while they are written. One lock keeps the two from writing at once; changes are
committed in the order they were queued either way.

SQLite's automatic checkpoints are off (topod.service.lease_db): the writer thread
checkpoints between batches, when no change is waiting, at least every
CHECKPOINT_EVERY_COMMITS commits, and regardless of waiting changes past
CHECKPOINT_FORCE_COMMITS, so the WAL stays bounded under any load.

After every commit the writer checks that the database is still the file at its path: an
unlinked or replaced database takes commits into a deleted inode and the next start finds
nothing, so from then on the store is broken and refuses every change.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from topod.service.lease_change import QueuedChange, failure_of, settle
from topod.service.lease_commit import StatementFailed, transaction
from topod.service.lease_db import LeaseStoreError, file_identity, reserve_wal

log = structlog.get_logger("topod")

# SQLite's automatic checkpoint runs inside the COMMIT that crosses its threshold: that
# change (and every answer waiting on its batch) waited for the copy into the database
# and its fsync. The writer checkpoints between batches instead, when nothing waits,
# once this many commits have gone into the WAL...
CHECKPOINT_EVERY_COMMITS = 200
# ...and, when changes never stop coming, after this many regardless: one bounded stall
# instead of a WAL that only grows.
CHECKPOINT_FORCE_COMMITS = 2000
# A confirmation (a lease's answer was written) is no change anyone waits on: it rides
# with the next commit, or is written on its own after this long. A crash or power loss
# in that window brings the lease back unconfirmed, the case the crash rule already
# covers (LeaseService.recover: [alloc] unconfirmed_grace_seconds, then it ends unless its
# holder renews it). It saves an fsync per grant of a lease with neither ttl nor owner.
LAZY_SECONDS = 1.0
# The loop commits a lone change itself only while the recent commits' average (an
# exponential one, COMMIT_AVERAGE_WEIGHT for the newest) is under this: a disk this slow
# would hold the loop, and every client, that long.
LOOP_COMMIT_UNDER_SECONDS = 0.002
COMMIT_AVERAGE_WEIGHT = 0.2
# A write running this long is a disk that does not answer: health says so while it lasts
# (the changes in it wait; nothing is undone, as the write may still land).
STALLED_WRITE_SECONDS = 5.0


class GroupCommitWriter:
    """The changes queued for the database and the thread that commits them (started by
    the first change queued on an event loop); LeaseStore owns one."""

    def __init__(self, path: Path, db: sqlite3.Connection) -> None:
        """db: the open database at `path` (topod.service.lease_db.open_database), written
        by this writer alone; close() closes it."""
        self.path = path
        self._db = db
        # The file this store writes is the one the next start reads only while the path
        # still names it: an unlinked or replaced database takes commits into a deleted
        # inode and the next start finds nothing. Checked after every commit.
        self._identity = file_identity(path)
        self.broken: str | None = None  # set once: the database is not the file at its path
        self.failing: str | None = None  # the last write's error, until a write succeeds
        self._pending: list[QueuedChange] = []
        # Held by whoever writes the database (the thread, or the loop committing a lone
        # change); taken while holding _cond, with the batch, so batches commit in order.
        self._db_lock = threading.Lock()
        self._commit_seconds: float | None = None  # the recent commits' average; None before the first
        self._writing_since: float | None = None  # when the write in progress began
        self._unsettled: dict[asyncio.Future, QueuedChange] = {}  # commit -> its change, until settled (on_commit)
        self._cond = threading.Condition()
        self._idle = False  # the writer waits on _cond: a change must wake it
        self._wake_due: asyncio.AbstractEventLoop | None = None  # the loop _wake is due on
        self._urgent = 0  # pending changes someone waits on (all but confirmations)
        self._lazy_deadline: float | None = None  # when pending confirmations alone get written
        self._lazy_timer: asyncio.AbstractEventLoop | None = None  # the loop a deadline timer runs on
        self._closing = False
        self._wal_reserved = False  # reserve_wal has run (after the first commit the thread writes)
        self._thread: threading.Thread | None = None
        self.commits = 0  # transactions written (one fsync each)
        self.changes = 0  # changes they carried
        self.checkpoints = 0
        self.loop_commits = 0  # of `commits`, those the event loop wrote itself
        self._unchecked_commits = 0  # commits in the WAL since the last checkpoint

    # -- queueing changes (on the event loop) -------------------------------------------
    def queue(self, sql: list[tuple[str, tuple | list]], undo: Callable[[], None],
              on_success: Callable[[], None] | None = None, lazy: bool = False) -> asyncio.Future | None:
        """The future of the commit holding this change; None when there is no event loop
        (tools, tests of parts): then the change is written before this returns.
        undo puts the mirror back when the change fails.
        on_success runs (on the loop) once the change is on disk, before the future resolves.
        lazy: the change waits for the next commit, at most LAZY_SECONDS (changes keep
        their order either way)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self.flush()
            if self.broken is not None:
                undo()
                raise LeaseStoreError(f"{self.broken}; the change was not made")
            op = QueuedChange(sql, undo, None, None, on_success=on_success)
            with self._db_lock:
                self._commit([op])
            if op.error is not None:
                undo()
                raise failure_of(op.error)
            if on_success is not None:
                on_success()
            return None
        future = loop.create_future()
        op = QueuedChange(sql, undo, future, loop, on_success=on_success)
        with self._cond:
            if self._closing:
                undo()
                raise LeaseStoreError("the lease store is closed; the change was not made")
            if self.broken is not None:
                undo()
                raise LeaseStoreError(f"{self.broken}; the change was not made")
            self._pending.append(op)
            self._unsettled[future] = op
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="topod-lease-writer", daemon=True)
                self._thread.start()
            if lazy:  # no wake-up: it rides with the next commit, or goes at its deadline
                if self._lazy_deadline is None:
                    self._lazy_deadline = time.monotonic() + LAZY_SECONDS
                    if self._lazy_timer is not loop:  # one timer at a time, not one per grant
                        self._lazy_timer = loop
                        loop.call_later(LAZY_SECONDS, self._lazy_due, loop)
            else:
                self._urgent += 1
                if self._idle and self._wake_due is not loop:
                    # An idle writer is woken once this turn of the loop is over (call_soon
                    # runs after every callback already due), so the changes made by the
                    # requests that arrived together share its commit; a busy writer takes
                    # what is pending when its commit ends. (Per loop: a loop closed before
                    # its turn ended must not keep the next one from waking the writer.)
                    self._wake_due = loop
                    loop.call_soon(self._wake, loop)
        return future

    def on_commit(self, commit: asyncio.Future, callback: Callable[[asyncio.Future], None]) -> None:
        """callback(commit) once the change is settled (on disk, or failed and undone), run
        by the callback that settles it: a loop turn sooner than add_done_callback, on the
        path from a commit to its answer. At once when the commit is settled already; a
        commit this store does not know gets add_done_callback."""
        op = self._unsettled.get(commit)
        if op is None:
            if commit.done():
                callback(commit)
            else:
                commit.add_done_callback(callback)
            return
        if op.then is None:
            op.then = []
        op.then.append(callback)

    def _settle_all(self, ops: list[QueuedChange]) -> None:
        """On the event loop: each change's future resolved (a failed one undone first),
        then its on_commit callbacks; the mirror follows the disk even when no one waits
        for the future any more."""
        for op in ops:
            if op.future is not None:
                self._unsettled.pop(op.future, None)
            settle(op)

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """The end of a loop turn that queued changes: a lone change is committed here
        (see the module's note), anything else wakes the idle writer."""
        with self._cond:
            self._wake_due = None
            batch = self._lone_change(loop)
            if batch is None:
                if self._idle and (self._urgent or self._closing):
                    self._idle = False
                    self._cond.notify()
                return
            self._db_lock.acquire()  # under _cond, with the batch: the order of commits
        try:
            self._commit(batch)
            self.loop_commits += 1
        finally:
            self._db_lock.release()
        self._settle_all(batch)

    def _lone_change(self, loop: asyncio.AbstractEventLoop) -> list[QueuedChange] | None:
        """Under _cond: the pending changes, taken, when the loop is to commit them itself:
        one change waits (confirmations may ride along), all of this loop, the writer
        idle, commits fast, no checkpoint due (the thread does it, after the commit)."""
        average = self._commit_seconds
        if (self._urgent != 1 or not self._idle or self._closing or average is None
                or average >= LOOP_COMMIT_UNDER_SECONDS
                or self._unchecked_commits + 1 >= CHECKPOINT_EVERY_COMMITS
                or any(op.loop is not loop for op in self._pending)):
            return None
        batch, self._pending = self._pending, []
        self._urgent, self._lazy_deadline = 0, None
        return batch

    def _lazy_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """A confirmation's deadline (on its loop): wake the idle writer to write it, if
        no commit has taken it along meanwhile; wait on for a later one's."""
        with self._cond:
            deadline = self._lazy_deadline
            if deadline is not None and deadline > time.monotonic():
                loop.call_later(deadline - time.monotonic(), self._lazy_due, loop)
                return
            self._lazy_timer = None
            if self._idle and self._pending and not self._urgent:
                self._idle = False
                self._cond.notify()

    # -- the writer thread ------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._urgent and not self._closing:
                    wait = None  # nothing pending: until a change comes
                    if self._pending:  # confirmations only: until their deadline
                        wait = self._lazy_deadline - time.monotonic()
                        if wait <= 0:
                            break
                    self._idle = True
                    self._cond.wait(wait)
                self._idle = False
                batch, self._pending = self._pending, []
                self._urgent, self._lazy_deadline = 0, None
                if not batch and self._closing:
                    return
                self._db_lock.acquire()
            try:
                self._commit(batch)
            finally:
                self._db_lock.release()
            by_loop: dict[asyncio.AbstractEventLoop, list[QueuedChange]] = {}
            for op in batch:
                if op.written is not None:
                    op.written.set()
                if op.loop is not None:
                    by_loop.setdefault(op.loop, []).append(op)
            for loop, ops in by_loop.items():
                try:  # one wake-up of the loop per commit, not one per change
                    loop.call_soon_threadsafe(self._settle_all, ops)
                except RuntimeError:  # the loop is gone (shutdown): nothing waits any more
                    pass
            self._checkpoint_if_due()
            if not self._wal_reserved and self.broken is None:  # a lost database's path names another file
                self._reserve_wal()

    def _commit(self, batch: list[QueuedChange]) -> None:
        """Write the batch and check the file, holding _db_lock."""
        self._writing_since = started = time.monotonic()
        try:
            self._write(batch)
        finally:
            self._writing_since = None
        elapsed = time.monotonic() - started
        average = self._commit_seconds
        self._commit_seconds = elapsed if average is None else average + COMMIT_AVERAGE_WEIGHT * (elapsed - average)
        self._check_own_file(batch)
        if any(op.sql for op in batch):
            self._unchecked_commits += 1

    def _check_own_file(self, batch: list[QueuedChange]) -> None:
        """After a write: is the database still the file at its path? If not, the batch
        went into a file no start will read: fail it (undone, the clients told) and refuse
        every later change. A failed write is remembered until one succeeds."""
        changes = [op for op in batch if op.sql]
        if not changes:
            return
        if self.broken is None:
            found = file_identity(self.path)
            if found != self._identity:
                what = "was deleted" if found is None else "was replaced by another file"
                self.broken = (f"lease database {self.path} {what} while topod ran; lease changes are refused "
                               "until topod is restarted (it then reads what is at that path)")
                log.error("lease_database_lost", path=str(self.path), reason=what)
        if self.broken is not None:
            for op in changes:
                op.error = op.error or LeaseStoreError(self.broken)
        errors = [op.error for op in changes if op.error is not None and not isinstance(op.error, sqlite3.IntegrityError)]
        if errors:
            self.failing = str(errors[0])
        elif self.broken is None:
            self.failing = None

    def problem(self) -> str | None:
        """Why lease writes fail now (health and STATUS= say it), or None."""
        if self.broken is not None:
            return self.broken
        if self.failing is not None:
            return f"lease writes failing: {self.failing}"
        since = self._writing_since
        if since is not None and (stalled := time.monotonic() - since) >= STALLED_WRITE_SECONDS:
            return f"lease write stalled for {stalled:.0f} s: the state dir's disk does not answer"
        return None

    def _write(self, batch: list[QueuedChange]) -> None:
        """One transaction for the whole batch (topod.service.lease_commit). A change that
        violates a constraint fails alone: the batch is first written straight, and only
        when a statement fails is it written again change by change, with a savepoint
        each. A failed COMMIT fails them all, and so does a fault that is no SQLite error
        (a bug, memory): the changes are undone and their clients told, and the writer, on
        the loop or its thread, goes on with the next batch."""
        try:
            try:
                self._transaction(batch, isolate=False)
            except StatementFailed:
                self._transaction(batch, isolate=True)
        except Exception as exc:  # noqa: BLE001 - see above: no change may wait for ever
            for op in batch:
                op.error = op.error or exc

    def _transaction(self, batch: list[QueuedChange], *, isolate: bool) -> None:
        transaction(self._db, batch, isolate=isolate)
        self.commits += 1
        self.changes += len(batch)

    # -- checkpoints, between batches ---------------------------------------------------
    def _checkpoint_if_due(self) -> None:
        """Copy the WAL into the database when it is due and nothing waits (the answers
        of this batch are already on their way), or regardless when it is long overdue."""
        due = self._unchecked_commits
        if due < CHECKPOINT_EVERY_COMMITS:
            return
        with self._cond:
            if self._urgent and due < CHECKPOINT_FORCE_COMMITS:
                return
            self._db_lock.acquire()  # under _cond, as every taker of both: no deadlock
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
            self._unchecked_commits = 0
        except sqlite3.Error as exc:  # tried again after the next CHECKPOINT_EVERY_COMMITS commits
            self._unchecked_commits = 0
            log.warning("lease_checkpoint_failed", error=str(exc))
        finally:
            self._db_lock.release()

    def _reserve_wal(self) -> None:
        """Once, after the first batch (its answers already on their way): the WAL's room
        for the commits until a checkpoint (lease_db.WAL_RESERVE_BYTES). A failure costs
        only the appends' time: logged, not tried again."""
        self._wal_reserved = True
        with self._cond:
            self._db_lock.acquire()  # under _cond, as every taker of both: no deadlock
        self._writing_since = time.monotonic()  # a disk that hangs here shows in health too
        try:
            problem = reserve_wal(self.path)
        finally:
            self._writing_since = None
            self._db_lock.release()
        if problem is not None:
            log.warning("lease_wal_not_reserved", reason=problem)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every change queued so far is on disk (or failed)."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                return
            marker = QueuedChange([], lambda: None, None, None, written=threading.Event())
            self._pending.append(marker)
            self._urgent += 1
            self._cond.notify()
        marker.written.wait(timeout)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
        # A writer thread still stuck in a write (a hung disk) keeps the connection: it is
        # not closed under it.
        if not self._db_lock.acquire(timeout=5):
            log.error("lease_database_left_open", path=str(self.path), reason="a write did not end")
            return
        try:
            try:  # leave a short WAL behind: the next start reads less
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error:
                pass
            self._db.close()
        finally:
            self._db_lock.release()
