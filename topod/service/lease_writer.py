"""The lease store's writer: one thread that owns the database and commits in groups;
its changes (QueuedChange: statements, undo, future, settled on the loop), a batch's
changes merged into a few multi-row statements, and a batch written as one transaction.

Every change queued while a commit is running goes into the next transaction, so
concurrent grants and releases share one fsync (WAL, synchronous=FULL). Each change comes
with its undo and gets a future that resolves, on its event loop, when the transaction
holding it is on disk; a failed commit undoes its changes (topod.service.lease_store's
mirror changed at once, before they were queued) and fails their futures.

Only this thread writes: the event loop never commits, checkpoints or fsyncs, whatever
the disk did recently, so a stalled disk stalls lease changes, never health, metrics or
the watchdog. A write running longer than STALLED_WRITE_SECONDS is reported while it lasts.

SQLite's automatic checkpoints are off (topod.service.lease_db): the writer thread
checkpoints between batches, when no change is waiting, at least every
CHECKPOINT_EVERY_COMMITS commits, and regardless of waiting changes past
CHECKPOINT_FORCE_COMMITS, so the WAL stays bounded under any load.

The ledger repairs itself. Before and after every commit the writer compares the files at
the database's path (the directory, the database, its WAL, a journal) with those it opened:
a file deleted or replaced there would take commits into an inode no start will read. On
any difference it copies what its connection holds (every committed change) into memory,
writes a complete database at the path from it (topod.service.lease_db.rebuild_at) and
reopens, before any answer goes out: a change is acknowledged only once it is in the file
the next start reads. A batch found lost after its commit waits for the rebuild (retried
with backoff); a batch that finds the ledger lost before it is written fails cleanly when
the rebuild fails (nothing of it is anywhere), and the rebuild is tried again before the
next batch.

Failures are remembered per kind of write (grant, update, confirm, release): health stays
degraded until a write of the same kind succeeds. When the state dir's free space falls
under GRANT_FLOOR_BYTES (or a write meets a full disk) new grants are refused at once,
so that releases, which need far less room (the WAL's reserved blocks), still go through.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from topod.errors import TopodError
from topod.service.lease_db import (LeaseConflictError, LeaseStoreError, close_quietly, io_fault, ledger_difference,
                                    ledger_files, rebuild_at, rescue, reserve_wal)

log = structlog.get_logger("topod")


# ---- a batch's changes as a few multi-row statements -------------------------------------
# A group commit's changes as a few multi-row statements instead of two or three per change.
#
# Each statement the writer thread runs gives up the GIL while SQLite works and must win it
# back from the event loop, which holds it most of the time under load: under saturation a
# commit of 11 changes (29 statements) took 0.5 ms at p50 against 0.15 ms for one change
# alone. Merged, a batch of any size is at most a handful of statements.
#
# Merging reorders: every insert, then the updates (in their own order), then every delete.
# That is the order of any one lease's changes within a batch (it is inserted before it can
# be changed, and gone from the mirror once deleted), and a GPU's row cannot be deleted and
# inserted again in one batch (the store frees a GPU only once its delete is on disk). A
# statement the merge does not know leaves the batch unmerged, written change by change.
# The lease store (topod.service.lease_store) builds its changes from these statements.

INSERT_LEASE = "INSERT INTO leases VALUES (?, ?)"
INSERT_DEVICES = "INSERT INTO lease_devices VALUES (?, ?)"
UPDATE_LEASE = "UPDATE leases SET body = ? WHERE id = ?"
CONFIRM_LEASE = "UPDATE leases SET body = json_set(body, '$.confirmed', json('true')) WHERE id = ?"
# lease_devices rows go with their lease (ON DELETE CASCADE, foreign keys on).
DELETE_LEASE = "DELETE FROM leases WHERE id = ?"
_CONFIRM_LEASES = CONFIRM_LEASE.replace("WHERE id = ?", "WHERE id IN")

# Rows per statement: far below SQLite's limit on bound parameters (32766 since 3.32; 999
# before), so a huge batch is a few statements, never an error.
CHUNK = 200

Statement = tuple[str, "tuple | list"]


def merged(changes: Iterable[Sequence[Statement]]) -> list[Statement] | None:
    """The statements writing `changes` (each a change's own statements, in queue order)
    with the same effect, merged; None when one of them is not a kind merging knows."""
    leases: list[tuple] = []
    devices: list[tuple] = []
    middle: list[Statement] = []  # updates and confirmations, in order
    deleted: list[str] = []
    for change in changes:
        for statement, params in change:
            if statement == INSERT_LEASE:
                leases.append(params)
            elif statement == INSERT_DEVICES:
                devices.extend(params if isinstance(params, list) else [params])
            elif statement in (UPDATE_LEASE, CONFIRM_LEASE):
                middle.append((statement, params))
            elif statement == DELETE_LEASE:
                deleted.append(params[0])
            else:
                return None
    gone = set(deleted)  # a confirmation of a lease deleted in the same batch is moot
    middle = [(statement, params) for statement, params in middle
              if not (statement == CONFIRM_LEASE and params[0] in gone)]
    out: list[Statement] = []
    out += _values("INSERT INTO leases VALUES", "(?, ?)", leases)
    out += _values("INSERT INTO lease_devices VALUES", "(?, ?)", devices)
    out += _confirmations_merged(middle)
    out += _in_list("DELETE FROM leases WHERE id IN", deleted)
    return out


def _values(head: str, row: str, rows: list[tuple]) -> list[Statement]:
    return [(f"{head} {', '.join([row] * len(chunk))}", tuple(v for r in chunk for v in r))
            for chunk in _chunks(rows)]


def _in_list(head: str, ids: list[str]) -> list[Statement]:
    return [(f"{head} ({', '.join('?' * len(chunk))})", tuple(chunk)) for chunk in _chunks(ids)]


def _confirmations_merged(middle: list[Statement]) -> list[Statement]:
    """Updates stay in order; a run of consecutive confirmations is one statement."""
    out: list[Statement] = []
    run: list[str] = []
    for statement, params in middle:
        if statement == CONFIRM_LEASE:
            run.append(params[0])
            continue
        out += _in_list(_CONFIRM_LEASES, run)
        run = []
        out.append((statement, params))
    return out + _in_list(_CONFIRM_LEASES, run)


def _chunks(rows: list) -> list[list]:
    return [rows[i:i + CHUNK] for i in range(0, len(rows), CHUNK)]


# ---- a queued change, and how it is settled on its event loop ----------------------------
# A change queued for the lease database: its statements, its undo, the future its caller
# waits on, and how it is settled on its event loop once its batch is written: resolved
# (after its on_success), or undone and failed with the error a client is shown. Settling
# is the loop's side of a commit: the writer decides when a batch is written and by whom;
# what a written or failed change does to the mirror and to whoever waits on it is the
# same either way.


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


# ---- one batch as one SQLite transaction -------------------------------------------------
# One group commit as one SQLite transaction: the statements the writer thread runs for a
# batch of changes, on the connection it owns. A batch is written straight first: its
# changes merged into a few multi-row statements (merged, above), each a GIL round trip of
# the writer thread. When a statement fails, the writer writes the batch again with
# `isolate`: change by change, each in a savepoint, so a change that violates a constraint
# fails alone (its `error` set) and the others still commit.


class StatementFailed(Exception):
    """A statement of a batch written without savepoints failed: write it again with them."""


def transaction(db: sqlite3.Connection, batch: Sequence[QueuedChange], *, isolate: bool) -> None:
    """Write the batch in one transaction. Without `isolate`, a failing statement raises
    StatementFailed (the transaction rolled back); with it, that change's savepoint is
    rolled back and its `error` set. A failed BEGIN or COMMIT, or any other fault, rolls
    the whole transaction back and raises."""
    try:
        db.execute("BEGIN IMMEDIATE")
        # A lone change is written as it is: merging one change only costs its time.
        statements = None if isolate or len(batch) == 1 else merged(change.sql for change in batch)
        if statements is not None:
            try:
                for statement, params in statements:
                    db.execute(statement, params)
            except sqlite3.Error as exc:
                raise StatementFailed from exc
        for change in batch if statements is None else ():
            if isolate:
                db.execute("SAVEPOINT change")
            try:
                for statement, params in change.sql:
                    if isinstance(params, list):
                        db.executemany(statement, params)
                    else:
                        db.execute(statement, params)
            except sqlite3.Error as exc:
                if not isolate:
                    raise StatementFailed from exc
                db.execute("ROLLBACK TO change")
                change.error = exc
            if isolate:
                db.execute("RELEASE change")
        db.execute("COMMIT")
    except Exception:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise


# ---- the writer thread ------------------------------------------------------------------

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
# A write running this long is a disk that does not answer: health says so while it lasts
# (the changes in it wait; nothing is undone, as the write may still land).
STALLED_WRITE_SECONDS = 5.0
# Grants are refused while the state dir has less room than this: a grant's row and its
# WAL frames take a few pages, a release less, and the WAL's reserved blocks
# (lease_db.WAL_RESERVE_BYTES) keep releases writable on a full disk. Checked after every
# commit, and every LOW_SPACE_RECHECK_SECONDS while low.
GRANT_FLOOR_BYTES = 4 << 20
LOW_SPACE_RECHECK_SECONDS = 5.0
# A ledger lost after a commit is rebuilt before that commit's answers go out: tried again
# after each of these pauses in turn (the last repeats) until it succeeds or topod stops.
REBUILD_BACKOFF_SECONDS = (0.05, 0.2, 1.0, 5.0)
# The kind of write a change is, by its first statement: failures are remembered per kind.
WRITE_KINDS = {INSERT_LEASE: "grant", UPDATE_LEASE: "update", CONFIRM_LEASE: "confirm", DELETE_LEASE: "release"}


def write_kind(op: QueuedChange) -> str:
    return WRITE_KINDS.get(op.sql[0][0], "other") if op.sql else "none"


class GroupCommitWriter:
    """The changes queued for the database and the thread that commits them (started by
    the first change queued on an event loop); LeaseStore owns one."""

    def __init__(self, path: Path, db: sqlite3.Connection, synchronous: str = "full") -> None:
        """db: the open database at `path` (topod.service.lease_db.open_database), written
        by this writer alone; close() closes it."""
        self.path = path
        self._db: sqlite3.Connection | None = db
        self._synchronous = synchronous
        # What the next start reads is what is at the path: the files opened there now,
        # checked around every commit (see the module's note).
        self._files = ledger_files(path)
        self.lost: str | None = None  # why the ledger at the path is not the one written, until rebuilt
        self._lost_how: str | None = None  # what was found at the path (self.lost adds why a rebuild failed)
        self._rescued: sqlite3.Connection | None = None  # the committed leases, in memory, until rebuilt
        self.rebuilds = 0
        self._failing: dict[str, str] = {}  # write kind -> its last error, until one of that kind succeeds
        self.space_low: str | None = None  # why grants are refused (the state dir's disk is full), or None
        self._pending: list[QueuedChange] = []
        # Held by whoever writes the database; taken while holding _cond, with the batch,
        # so batches commit in order.
        self._db_lock = threading.Lock()
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
        """The end of a loop turn that queued changes: wake the idle writer (never a write
        here: the loop only routes)."""
        with self._cond:
            self._wake_due = None
            if self._idle and (self._urgent or self._closing):
                self._idle = False
                self._cond.notify()

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
            recheck_space = False
            with self._cond:
                while not self._urgent and not self._closing:
                    wait = LOW_SPACE_RECHECK_SECONDS if self.space_low else None  # else until a change comes
                    if self._pending:  # confirmations only: until their deadline
                        wait = self._lazy_deadline - time.monotonic()
                        if wait <= 0:
                            break
                    self._idle = True
                    if not self._cond.wait(wait) and self.space_low and not self._pending:
                        recheck_space = True  # outside _cond: the loop takes it to queue a change
                        break
                self._idle = False
                batch, self._pending = self._pending, []
                self._urgent, self._lazy_deadline = 0, None
                if not batch and self._closing:
                    return
                if not batch and recheck_space:
                    batch = None
                else:
                    self._db_lock.acquire()
            if batch is None:
                self._check_space()
                continue
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
            if not self._wal_reserved and self.lost is None:
                self._reserve_wal()

    def _commit(self, batch: list[QueuedChange]) -> None:
        """Write the batch into the ledger at the path, holding _db_lock: rebuilt first
        when it was lost; checked again once written, and rebuilt (with the batch) before
        anyone is answered when it was lost meanwhile."""
        changes = [op for op in batch if op.sql]
        if not changes:
            return
        if not self._ledger_in_place():
            for op in changes:
                op.error = op.error or LeaseStoreError(f"{self.lost}; the change was not made")
            self._note_outcome(changes)
            return
        self._writing_since = time.monotonic()
        try:
            self._write(batch)
        finally:
            self._writing_since = None
        self._unchecked_commits += 1
        if any(op.error is None for op in changes) and not self._ledger_in_place():
            self._rebuild_until_done(changes)
        self._note_outcome(changes)
        self._check_space()

    def _ledger_in_place(self) -> bool:
        """Is the ledger the writer writes the one at the path? When it is not, rebuild it
        there from what the writer's connection holds; False when that failed (self.lost
        says why, and the next call tries again)."""
        if self._rescued is None:
            if self._lost_how is None:  # found now (logged once, however many tries it takes)
                difference = ledger_difference(self._files, ledger_files(self.path))
                if difference is None:
                    return True
                self._lost_how = self.lost = f"lease database {self.path}: {difference} while topod ran"
                log.error("lease_ledger_lost", path=str(self.path), reason=difference)
            try:
                self._rescued = rescue(self._db)
            except (sqlite3.Error, OSError) as exc:
                self.lost = f"{self._lost_how}; reading the leases back failed: {exc}"
                return False
        try:
            db = rebuild_at(self.path, self._rescued, self._synchronous, self._release_old)
        except (sqlite3.Error, OSError, LeaseStoreError) as exc:
            self.lost = f"{self._lost_how}; rebuilding it failed: {exc}"
            log.error("lease_ledger_rebuild_failed", path=str(self.path), error=str(exc))
            return False
        self._db = db
        leases = self._rescued.execute("SELECT count(*) FROM leases").fetchone()[0]
        self._rescued.close()
        self._rescued = None
        self._files = ledger_files(self.path)
        self._wal_reserved, self._unchecked_commits = False, 0
        self.rebuilds += 1
        log.warning("lease_ledger_rebuilt", path=str(self.path), leases=leases, reason=self._lost_how)
        self.lost = self._lost_how = None
        return True

    def _rebuild_until_done(self, changes: list[QueuedChange]) -> None:
        """The batch went into a ledger lost meanwhile: its answers wait until a rebuilt
        one holds it. Should topod stop first, the changes fail (no one can be told)."""
        for pause in self._pauses():
            if self._closing:
                break
            time.sleep(pause)
            if self._ledger_in_place():
                return
        for op in changes:
            op.error = op.error or LeaseStoreError(f"{self.lost}; topod stopped before it was rebuilt")

    @staticmethod
    def _pauses():
        yield from REBUILD_BACKOFF_SECONDS
        while True:
            yield REBUILD_BACKOFF_SECONDS[-1]

    def _release_old(self) -> None:
        """Close the connection to the lost ledger (rebuild_at says when)."""
        db, self._db = self._db, None
        close_quietly(db)

    def _note_outcome(self, changes: list[QueuedChange]) -> None:
        """Remember failures per kind of write, and clear a kind's once one succeeds."""
        for op in changes:
            kind = write_kind(op)
            error = op.error
            if error is None:
                self._failing.pop(kind, None)
            elif not isinstance(error, sqlite3.IntegrityError):  # a conflict: the client's, not the disk's
                self._failing[kind] = self._explain(error)
                if isinstance(error, sqlite3.Error) and getattr(error, "sqlite_errorname", "") == "SQLITE_FULL":
                    self.space_low = f"the state dir's disk is full ({error})"

    def _explain(self, error: BaseException) -> str:
        """The error as health says it: an I/O fault of the disk named as such (SQLite can
        report one as a malformed image)."""
        if isinstance(error, sqlite3.Error):
            fault = io_fault(self.path)
            if fault is not None:
                return f"I/O error on the state dir's disk: {fault} (SQLite: {error})"
        return str(error)

    def _check_space(self) -> None:
        """Grants are refused while the state dir's free space is under GRANT_FLOOR_BYTES."""
        try:
            found = os.statvfs(self.path.parent)
        except OSError:
            return
        free = found.f_bavail * found.f_frsize
        if free < GRANT_FLOOR_BYTES:
            if self.space_low is None:
                log.warning("lease_grants_refused", reason="state dir nearly full", free_bytes=free)
            self.space_low = (f"the state dir's disk has {free // 1024} KiB free (grants need "
                              f"{GRANT_FLOOR_BYTES >> 20} MiB)")
        elif self.space_low is not None:
            log.info("lease_grants_resumed", free_bytes=free)
            self.space_low = None

    def problem(self) -> str | None:
        """Why lease writes fail now (health and STATUS= say it), or None."""
        problems = []
        if self.lost is not None:
            problems.append(self.lost)
        failing = dict(self._failing)  # the writer thread changes it
        if failing:
            problems.append("lease writes failing: " + "; ".join(f"{kind}: {error}"
                                                               for kind, error in sorted(failing.items())))
        if self.space_low is not None:
            problems.append(f"grants refused: {self.space_low}")
        since = self._writing_since
        if since is not None and (stalled := time.monotonic() - since) >= STALLED_WRITE_SECONDS:
            problems.append(f"lease write stalled for {stalled:.0f} s: the state dir's disk does not answer")
        return "; ".join(problems) or None

    def _write(self, batch: list[QueuedChange]) -> None:
        """One transaction for the whole batch (transaction, above). A change that
        violates a constraint fails alone: the batch is first written straight, and only
        when a statement fails is it written again change by change, with a savepoint
        each. A failed COMMIT fails them all, and so does a fault that is no SQLite error
        (a bug, memory): the changes are undone and their clients told, and the writer
        goes on with the next batch."""
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
        if due < CHECKPOINT_EVERY_COMMITS or self.lost is not None:
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
            # Only into the WAL this writer opened: a lost one's path may name another file.
            problem = reserve_wal(self.path) if ledger_difference(self._files, ledger_files(self.path)) is None \
                else "the ledger's files changed; not reserved"
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
        if self._db is None and self._rescued is None:  # closed already
            return
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
            # A ledger lost since the last commit is rebuilt before the close: the close's
            # checkpoint would move the WAL's commits into a file no start reads and then
            # delete the WAL at the path, which may be the only copy of them.
            if not self._ledger_in_place():
                log.error("lease_database_left_open", path=str(self.path), reason=self.lost)
                return
            try:  # leave a short WAL behind: the next start reads less
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error:
                pass
            close_quietly(self._db)
            self._db = None
        finally:
            self._db_lock.release()
