"""The lease store's writer: group commits, written by the lease writer process.

Every change queued while a commit is running goes into the next transaction, so
concurrent grants and releases share one fsync (WAL, synchronous=FULL). Each change comes
with its undo and gets a future that resolves, on its event loop, when the transaction
holding it is on disk; a failed commit undoes its changes (topod.service.lease_store's
mirror changed at once, before they were queued) and fails their futures.

The database is written by a child process (topod.service.writer_process: why a process,
not a thread), driven from the event loop: the changes queued in one turn of the loop go
as one batch when the turn ends, one batch in flight at a time; the loop reads the answer
when it comes, settles the batch and sends what queued meanwhile. A lone change while
commits are fast (their recent average under LOOP_COMMIT_UNDER_SECONDS) is waited for in
place: the loop had nothing else to do, and polling spares the wake-ups.

A writer process that dies is replaced at once. Every transaction records its batch's
number (topod.service.lease_commit), so the batch it had in flight is read back from the
new process: answered when it landed, sent again when it did not (failed, when a second
process dies on it). Past MAX_DEATHS deaths in DEATH_WINDOW_SECONDS, or when no process
can be forked at all, the daemon writes in-process, on the event loop, and says so in
health and the log: slower, never wrong.

SQLite's automatic checkpoints are off (topod.service.lease_db): the writer checkpoints
between batches, when no change is waiting, at least every CHECKPOINT_EVERY_COMMITS
commits, and regardless of waiting changes past CHECKPOINT_FORCE_COMMITS, so the WAL stays
bounded under any load.

After every commit the writer checks that the database is still the file at its path: an
unlinked or replaced database takes commits into a deleted inode and the next start finds
nothing, so from then on the store is broken and refuses every change.

The writer is used from one thread at a time: the event loop's, or a caller with no loop
running (tools, start-up, shutdown).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from topod.errors import TopodError
from topod.service import lease_commit
from topod.service.lease_db import LeaseConflictError, LeaseStoreError, file_identity
from topod.service.writer_process import BATCH, CHECKPOINT, WriterGone, WriterOpenFailed, WriterProcess

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
# The loop waits in place for a lone change's commit only while the recent commits'
# average (an exponential one, COMMIT_AVERAGE_WEIGHT for the newest) is under this: a
# disk this slow would hold the loop, and every client, that long.
LOOP_COMMIT_UNDER_SECONDS = 0.002
COMMIT_AVERAGE_WEIGHT = 0.2
# A write running this long is a disk that does not answer: health says so while it lasts
# (the changes in it wait; nothing is undone, as the write may still land).
STALLED_WRITE_SECONDS = 5.0
# More deaths of the writer process than this within the window: write in-process.
MAX_DEATHS = 3
DEATH_WINDOW_SECONDS = 60.0
# How long the last batches may take at close, and the process to end after them.
CLOSE_SECONDS = 30.0
STOP_SECONDS = 5.0


@dataclass(slots=True)
class _Op:
    sql: list[tuple[str, tuple | list]]  # statements; executemany when params is a list
    undo: Callable[[], None]
    future: asyncio.Future | None
    loop: asyncio.AbstractEventLoop | None
    error: BaseException | None = field(default=None)
    on_success: Callable[[], None] | None = None  # on the loop, once the change is on disk
    then: list[Callable[[asyncio.Future], None]] | None = None  # on_commit's callbacks


class GroupCommitWriter:
    """The changes queued for the database and the process that commits them; LeaseStore
    owns one."""

    def __init__(self, path: Path, open_connection: Callable[[], sqlite3.Connection]) -> None:
        """open_connection: opens the database at `path` for writing
        (topod.service.lease_db.open_database), in the writer process, or in this one
        when no process can be had. LeaseStoreError when it cannot be opened."""
        self.path = path
        self._open_connection = open_connection
        # The file this store writes is the one the next start reads only while the path
        # still names it: an unlinked or replaced database takes commits into a deleted
        # inode and the next start finds nothing. Checked after every commit.
        self._identity = file_identity(path)
        self.broken: str | None = None  # set once: the database is not the file at its path
        self.failing: str | None = None  # the last write's error, until a write succeeds
        self.in_process: str | None = None  # why the daemon writes the database itself, if it does
        self._process: WriterProcess | None = None
        self._local: sqlite3.Connection | None = None  # the database, when written in-process
        self._pending: list[_Op] = []
        self._urgent = 0  # pending changes someone waits on (all but confirmations)
        self._lazy_deadline: float | None = None  # when pending confirmations alone get written
        self._lazy_timer: asyncio.AbstractEventLoop | None = None  # the loop a deadline timer runs on
        self._send_due: asyncio.AbstractEventLoop | None = None  # the loop a send is due on
        self._in_flight: list[_Op] | None = None  # the batch the process writes ([]: a checkpoint)
        self._in_flight_number = 0
        self._in_flight_tries = 0  # processes that took this batch (a second death fails it)
        self._reader_loop: asyncio.AbstractEventLoop | None = None  # the loop reading the process's answers
        self._sequence = 0  # the last batch number given
        self._commit_seconds: float | None = None  # the recent commits' average; None before the first
        self._writing_since: float | None = None  # when the write in flight began
        self._unsettled: dict[asyncio.Future, _Op] = {}  # commit -> its change, until settled (on_commit)
        self._deaths: list[float] = []
        self._closing = False
        self._closed = False
        self.commits = 0  # transactions written (one fsync each)
        self.changes = 0  # changes they carried
        self.checkpoints = 0
        self.waited_in_place = 0  # of `commits`, those the loop polled for (a lone change)
        self.restarts = 0  # writer processes started after the first
        self._unchecked_commits = 0  # commits in the WAL since the last checkpoint
        self._start_writer(first=True)

    # -- queueing changes ---------------------------------------------------------------
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
        if self._closing:
            undo()
            raise LeaseStoreError("the lease store is closed; the change was not made")
        if self.broken is not None:
            undo()
            raise LeaseStoreError(f"{self.broken}; the change was not made")
        if loop is None:
            return self._write_now(_Op(sql, undo, None, None, on_success=on_success))
        self._adopt(loop)
        future = loop.create_future()
        op = _Op(sql, undo, future, loop, on_success=on_success)
        self._pending.append(op)
        self._unsettled[future] = op
        if lazy:  # no batch for it: it rides with the next one, or goes at its deadline
            if self._lazy_deadline is None:
                self._lazy_deadline = time.monotonic() + LAZY_SECONDS
                if self._lazy_timer is not loop:  # one timer at a time, not one per grant
                    self._lazy_timer = loop
                    loop.call_later(LAZY_SECONDS, self._lazy_due, loop)
        else:
            self._urgent += 1
            if self._in_flight is None and self._send_due is not loop:
                # Sent once this turn of the loop is over (call_soon runs after every
                # callback already due), so the changes made by the requests that arrived
                # together share its commit; while a batch is in flight, what is pending
                # goes when its answer comes.
                self._send_due = loop
                loop.call_soon(self._send_next, loop)
        return future

    def _write_now(self, op: _Op) -> None:
        """With no event loop: everything queued before, then this change, on disk."""
        self._drain(CLOSE_SECONDS)
        self._send([op], None)
        self._drain(CLOSE_SECONDS)
        if op.error is not None:
            op.undo()
            raise _failure(op.error)
        if op.on_success is not None:
            op.on_success()
        return None

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

    def _lazy_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """A confirmation's deadline (on its loop): send it, if no commit has taken it
        along meanwhile; wait on for a later one's."""
        deadline = self._lazy_deadline
        if deadline is not None and deadline > time.monotonic():
            loop.call_later(deadline - time.monotonic(), self._lazy_due, loop)
            return
        self._lazy_timer = None
        if self._pending and self._in_flight is None and not self._closing:
            self._send(self._take_pending(), loop)

    # -- sending batches (on the event loop) ----------------------------------------------
    def _send_next(self, loop: asyncio.AbstractEventLoop) -> None:
        """The end of a loop turn that queued changes: they go as one batch."""
        if self._send_due is loop:
            self._send_due = None
        if self._in_flight is None and self._urgent:
            lone = self._urgent == 1
            self._send(self._take_pending(), loop, lone)

    def _take_pending(self) -> list[_Op]:
        batch, self._pending = self._pending, []
        self._urgent, self._lazy_deadline = 0, None
        return batch

    def _send(self, batch: list[_Op], loop: asyncio.AbstractEventLoop | None, lone: bool = False) -> None:
        """Hand the batch to the writer (written at once in-process). On a loop, its answer
        is read when it comes (waited for in place for a lone change while commits are
        fast); with none, the caller drains."""
        self._sequence += 1
        self._in_flight, self._in_flight_number, self._in_flight_tries = batch, self._sequence, 0
        self._writing_since = time.monotonic()
        if self._process is None and self._local is None:  # broken, and no writer left to try
            self._answered(False, [(lease_commit.ERROR, self.broken or "no lease writer")] * len(batch))
            return
        if self._local is not None:
            committed, outcomes = lease_commit.write_batch(self._local, self._sequence, [op.sql for op in batch])
            self._answered(committed, outcomes)
            return
        self._transmit(loop)
        if loop is None or self._in_flight is None:
            return
        average = self._commit_seconds
        if lone and average is not None and average < LOOP_COMMIT_UNDER_SECONDS:
            try:
                replies = self._process.spin(LOOP_COMMIT_UNDER_SECONDS)
            except WriterGone:
                self._writer_died(loop)
                return
            if replies:
                self.waited_in_place += 1
                self._take_replies(replies, loop)

    def _transmit(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Send the batch in flight to the writer process (again, after a death)."""
        batch = self._in_flight
        self._in_flight_tries += 1
        message = (CHECKPOINT, "PASSIVE") if not batch else (BATCH, self._in_flight_number, [op.sql for op in batch])
        try:
            self._process.send(message)
        except WriterGone:
            self._writer_died(loop)
            return
        if loop is not None:
            self._listen(loop)

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._reader_loop is loop:
            return
        self._forget_reader()
        loop.add_reader(self._process.fileno(), self._readable, loop)
        self._reader_loop = loop

    def _forget_reader(self) -> None:
        reader, self._reader_loop = self._reader_loop, None
        if reader is not None and not reader.is_closed() and self._process is not None and self._process.fileno() >= 0:
            reader.remove_reader(self._process.fileno())

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """A batch whose loop closed before its answer came: taken here, so the next
        loop's changes do not wait behind it."""
        reader = self._reader_loop
        if reader is not None and reader is not loop and reader.is_closed():
            self._reader_loop = None
            self._drain(CLOSE_SECONDS)

    def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            replies = self._process.poll()
        except WriterGone:
            self._writer_died(loop)
            return
        self._take_replies(replies, loop)

    def _take_replies(self, replies: list[tuple], loop: asyncio.AbstractEventLoop | None) -> None:
        for reply in replies:
            if reply[0] == BATCH and self._in_flight and reply[1] == self._in_flight_number:
                self._answered(reply[2], reply[3])
            elif reply[0] == CHECKPOINT and self._in_flight == []:
                self._checkpointed(reply[1])
            else:  # an answer to nothing in flight: the process cannot be trusted any more
                log.error("lease_writer_confused", reply=repr(reply)[:200])
                self._forget_reader()
                self._process.kill()
                self._writer_died(loop)
                return
        if loop is not None:
            if self._send_due is not loop:
                self._send_due = loop
                loop.call_soon(self._next_due, loop)

    def _next_due(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._send_due is loop:
            self._send_due = None
        self._next(loop)

    # -- answers ------------------------------------------------------------------------
    def _answered(self, committed: bool, outcomes: list[lease_commit.Outcome]) -> None:
        """The batch in flight is written (or failed): its changes settled."""
        batch, self._in_flight = self._in_flight, None
        elapsed = time.monotonic() - self._writing_since
        self._writing_since = None
        average = self._commit_seconds
        self._commit_seconds = elapsed if average is None else average + COMMIT_AVERAGE_WEIGHT * (elapsed - average)
        for op, outcome in zip(batch, outcomes):
            if outcome is not None:
                op.error = (sqlite3.IntegrityError if outcome[0] == lease_commit.CONFLICT else LeaseStoreError)(outcome[1])
        if committed:
            self.commits += 1
            self.changes += len(batch)
            self._unchecked_commits += 1
        self._check_own_file(batch)
        self._deliver(batch)

    def _checkpointed(self, error: str | None) -> None:
        self._in_flight = None
        self._writing_since = None
        self._unchecked_commits = 0  # a failed one is tried again after the next CHECKPOINT_EVERY_COMMITS
        if error is None:
            self.checkpoints += 1
        else:
            log.warning("lease_checkpoint_failed", error=error)

    def _next(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Between batches: a checkpoint when it is due and nothing waits (or regardless,
        long overdue), else what queued meanwhile."""
        if self._in_flight is not None:
            return
        due = self._unchecked_commits
        if due >= CHECKPOINT_EVERY_COMMITS and (not self._urgent or due >= CHECKPOINT_FORCE_COMMITS):
            self._checkpoint(loop)
        elif self._pending and (self._urgent or self._closing or loop is None
                                or (self._lazy_deadline or float("inf")) <= time.monotonic()):
            self._send(self._take_pending(), loop)

    def _checkpoint(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._in_flight, self._writing_since = [], time.monotonic()
        if self._local is not None:
            self._checkpointed(lease_commit.checkpoint(self._local, "PASSIVE"))
            return
        self._transmit(loop)

    def _deliver(self, batch: list[_Op]) -> None:
        """Each change settled on its own loop (now, when it is the running one); changes
        of no loop are the caller's (_write_now)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        by_loop: dict[asyncio.AbstractEventLoop, list[_Op]] = {}
        for op in batch:
            if op.loop is not None:
                by_loop.setdefault(op.loop, []).append(op)
        for loop, ops in by_loop.items():
            if loop is running:
                self._settle_all(ops)
                continue
            try:  # one wake-up of that loop per batch, not one per change
                loop.call_soon_threadsafe(self._settle_all, ops)
            except RuntimeError:  # the loop is gone (shutdown): nothing waits any more
                pass

    def _settle_all(self, ops: list[_Op]) -> None:
        """On the event loop: each change's future resolved (a failed one undone first),
        then its on_commit callbacks; the mirror follows the disk even when no one waits
        for the future any more."""
        for op in ops:
            if op.future is not None:
                self._unsettled.pop(op.future, None)
            _settle(op)

    def _check_own_file(self, batch: list[_Op]) -> None:
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
                self._lost(f"lease database {self.path} {what} while topod ran", what)
        if self.broken is not None:
            for op in changes:
                op.error = op.error or LeaseStoreError(self.broken)
        errors = [op.error for op in changes if op.error is not None and not isinstance(op.error, sqlite3.IntegrityError)]
        if errors:
            self.failing = str(errors[0])
        elif self.broken is None:
            self.failing = None

    def _lost(self, what: str, reason: str) -> None:
        self.broken = f"{what}; lease changes are refused until topod is restarted (it then reads what is at that path)"
        log.error("lease_database_lost", path=str(self.path), reason=reason)

    # -- the writer process's life ------------------------------------------------------
    def _start_writer(self, first: bool) -> None:
        """A writer process, the batch numbering taken from what the database holds; the
        daemon itself when none can be had (see the module's note)."""
        if len(self._deaths) > MAX_DEATHS:
            self._write_in_process(f"the lease writer process died {len(self._deaths)} times within "
                                   f"{DEATH_WINDOW_SECONDS:.0f} s")
            return
        try:
            self._process, (last, outcomes) = WriterProcess.start(self._open_connection)
        except WriterOpenFailed as exc:
            if first:
                raise LeaseStoreError(str(exc)) from None
            self._write_in_process(f"a new lease writer process could not open the database: {exc}")
            return
        except (OSError, WriterGone) as exc:
            self._write_in_process(f"no lease writer process: {exc}")
            return
        if not first:
            self.restarts += 1
        self._sequence = max(self._sequence, last)
        self._last_found = (last, outcomes)

    def _write_in_process(self, why: str) -> None:
        self._process = None
        self.in_process = why
        log.error("lease_writes_in_process", reason=why, effect="lease writes run on the daemon's event loop")
        try:
            self._local = self._open_connection()
        except LeaseStoreError as exc:
            self._local = None
            self._lost(f"lease database {self.path} cannot be opened again ({exc})", "reopen failed")
            raise
        self._last_found = lease_commit.last_batch(self._local)
        self._sequence = max(self._sequence, self._last_found[0])

    def _writer_died(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """The process ended: a new one takes over; the batch it had in flight is answered
        from what the database holds, or sent again (see the module's note)."""
        process = self._process
        self._forget_reader()
        how = process.reap(timeout=1.0) or "still running"
        process.kill()
        now = time.monotonic()
        self._deaths = [at for at in self._deaths if now - at < DEATH_WINDOW_SECONDS] + [now]
        log.error("lease_writer_died", pid=process.pid, exit=how, batch_in_flight=bool(self._in_flight))
        batch = self._in_flight
        if self.broken is None and file_identity(self.path) != self._identity:
            # A new writer would make a new, empty file at the path: the leases are elsewhere.
            self._lost(f"lease database {self.path} was deleted or replaced while topod ran", "gone at a restart")
        else:
            try:
                self._start_writer(first=False)
            except LeaseStoreError:
                pass
        if self._process is None and self._local is None:
            self._in_flight = None
            for op in batch or ():
                op.error = op.error or LeaseStoreError(self.broken or "no lease writer")
            self._writing_since = None
            self._deliver(batch or [])
            return
        if batch == []:  # a checkpoint: tried again later
            self._checkpointed("the lease writer process died during it")
        elif batch is not None:
            self._resume(batch, loop)
        if loop is not None:
            self._next(loop)

    def _resume(self, batch: list[_Op], loop: asyncio.AbstractEventLoop | None) -> None:
        last, outcomes = self._last_found
        if last >= self._in_flight_number:  # it landed: the new process read it back
            self._answered(True, outcomes or [None] * len(batch))
        elif self._in_flight_tries >= 2:
            self._answered(False, [(lease_commit.ERROR, "the lease writer process died twice writing it")] * len(batch))
        elif self._local is not None:
            committed, found = lease_commit.write_batch(self._local, self._in_flight_number, [op.sql for op in batch])
            self._answered(committed, found)
        else:
            self._transmit(loop)

    def _drain(self, timeout: float) -> None:
        """Without the loop (no loop runs, or shutdown): wait for the batch in flight, then
        write everything pending, until nothing is left or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            if self._in_flight is None:
                if not self._pending:
                    return
                self._send(self._take_pending(), None)
                continue
            if self._process is None:
                return
            try:
                reply = self._process.wait(max(0.0, deadline - time.monotonic()))
            except WriterGone:
                self._writer_died(None)
                continue
            if reply is None:
                return
            self._take_replies([reply], None)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every change queued so far is on disk (or failed)."""
        self._drain(timeout)

    def close(self) -> None:
        """Write what is pending, end the writer process, close the database."""
        if self._closed:
            return
        self._closing = True
        self._drain(CLOSE_SECONDS)
        self._closed = True
        self._forget_reader()
        if self._process is not None:
            if not self._process.stop(STOP_SECONDS):
                log.error("lease_database_left_open", path=str(self.path), pid=self._process.pid,
                          reason="the lease writer process did not end: a write did not end")
            self._process = None
        if self._local is not None:
            if self._in_flight is None:
                lease_commit.checkpoint(self._local, "TRUNCATE")  # leave a short WAL behind
            self._local.close()
            self._local = None

    # -- what health says ----------------------------------------------------------------
    def problem(self) -> str | None:
        """Why lease writes fail or lag now (health and STATUS= say it), or None."""
        if self.broken is not None:
            return self.broken
        if self.failing is not None:
            return f"lease writes failing: {self.failing}"
        since = self._writing_since
        if since is not None and (stalled := time.monotonic() - since) >= STALLED_WRITE_SECONDS:
            return f"lease write stalled for {stalled:.0f} s: the state dir's disk does not answer"
        if self.in_process is not None and self._deaths:
            return f"lease writes run in the daemon itself: {self.in_process}"
        return None

    def report(self) -> dict:
        """The writer in health: where it writes, and how its commits went."""
        return {"process": self._process.pid if self._process is not None else None,
                "in_process": self.in_process, "restarts": self.restarts,
                "waited_in_place": self.waited_in_place, "checkpoints": self.checkpoints}


def _settle(op: _Op) -> None:
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
            future.set_exception(_failure(op.error))
    for callback in op.then or ():
        try:
            callback(future)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - as asyncio's Handle: reported, the rest of the batch settles
            op.loop.call_exception_handler({"message": "lease store: an on_commit callback failed",
                                            "exception": exc, "future": future})


def _failure(error: BaseException) -> TopodError:
    if isinstance(error, sqlite3.IntegrityError):
        return LeaseConflictError(f"refused by the lease database: {error}")
    return LeaseStoreError(f"lease database write failed, change undone: {error}")
