"""The lease store: SQLite in the state dir, the only allocation state that survives.

One writer thread owns the database and commits in groups: every change queued while a
commit is running goes into the next transaction, so concurrent grants and releases
share one fsync (WAL, synchronous=FULL). The in-memory mirror changes at once, on the
event loop, so decisions always see it; each change returns a future that resolves when
the transaction holding it is on disk, and the API answers only after that. A failed
commit undoes its changes in the mirror.

The database is opened in EXCLUSIVE locking mode: the writer's connection holds the
file's lock for the daemon's life (a second topod, or any other writer, is refused with a
clear message rather than racing it), and SQLite keeps the WAL index in heap memory
instead of a mapped -shm file. A mapping is what turned an I/O fault (a file made
immutable, a page the disk could not back) into SIGBUS and the death of the daemon; now it
is an error of that commit, undone and reported. SQLite's automatic checkpoints are off:
the writer thread checkpoints between batches, when no change is waiting, at least every
CHECKPOINT_EVERY_COMMITS commits, and regardless of waiting changes past
CHECKPOINT_FORCE_COMMITS, so the WAL stays bounded under any load.

A GPU (by PCI address) is in at most one lease: the mirror refuses a conflicting lease
before it is queued, and the lease_devices primary key refuses it again on disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from topod.alloc.nics import lease_nic_keys
from topod.errors import TopodError
from topod.host import file_kind
from topod.service.batch_sql import (CONFIRM_LEASE, DELETE_LEASE, INSERT_DEVICES, INSERT_LEASE, UPDATE_LEASE,
                                     merged)
from topod.service.lease import Lease

log = structlog.get_logger("topod")

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lease_devices (
    address TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL REFERENCES leases(id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SCHEMA_VERSION = "2"  # 1: lease_gpus keyed by GPU index, decision as an untyped dict
SYNCHRONOUS = ("full", "normal")
# SQLite's automatic checkpoint runs inside the COMMIT that crosses its threshold: that
# change (and every answer waiting on its batch) waited for the copy into the database
# and its fsync. The writer checkpoints between batches instead, when nothing waits,
# once this many commits have gone into the WAL...
CHECKPOINT_EVERY_COMMITS = 200
# ...and, when changes never stop coming, after this many regardless: one bounded stall
# instead of a WAL that only grows.
CHECKPOINT_FORCE_COMMITS = 2000
BUSY_TIMEOUT_MS = 5000  # sqlite3.connect's default, made explicit
# A confirmation (a lease's answer was written) is no change anyone waits on: it rides
# with the next commit, or is written on its own after this long. A crash or power loss
# in that window brings the lease back unconfirmed, the case the crash rule already
# covers (LeaseService.recover: [alloc] unconfirmed_grace_seconds, then it ends unless its
# holder renews it). It saves an fsync per grant of a lease with neither ttl nor owner.
LAZY_SECONDS = 1.0


class LeaseConflictError(TopodError):
    code = "gpu_already_leased"


class LeaseStoreError(TopodError):
    """The lease database could not be written: the change was undone."""

    code = "state_write_failed"


@dataclass(slots=True)
class _Op:
    sql: list[tuple[str, tuple | list]]  # statements; executemany when params is a list
    undo: Callable[[], None]
    future: asyncio.Future | None
    loop: asyncio.AbstractEventLoop | None
    error: BaseException | None = field(default=None)
    written: threading.Event | None = None  # set once the op's batch is written (flush)
    on_success: Callable[[], None] | None = None  # on the loop, once the change is on disk
    then: list[Callable[[asyncio.Future], None]] | None = None  # on_commit's callbacks


class LeaseStore:
    def __init__(self, state_dir: str | Path, synchronous: str = "full") -> None:
        """synchronous: "full" (the default: a lease survives power loss once answered) or
        "normal" (WAL: survives a crash of topod or the OS, may lose the last commits on
        power loss; fewer fsyncs)."""
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}, got {synchronous!r}")
        directory = Path(state_dir)
        _private_directory(directory)
        self.path = directory / "leases.sqlite3"
        # Each file of the database is a regular file of its own, made private through its
        # descriptor: a link planted in its place is refused, never followed (a chmod by
        # path would change whatever it names: /dev/zero, another daemon's state).
        for suffix in ("-wal", "-shm", ""):
            _private_file(Path(f"{self.path}{suffix}"), create=not suffix)
        self._db: sqlite3.Connection | None = None
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                       timeout=BUSY_TIMEOUT_MS / 1000)
            # Before the first access in WAL mode: no -shm mapping, the lock held for life.
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA wal_autocheckpoint=0")  # see CHECKPOINT_EVERY_COMMITS
            self._migrate()
        except BaseException as exc:
            self._close_quietly()
            if isinstance(exc, sqlite3.OperationalError):
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise LeaseStoreError(f"lease database {self.path}: {exc}") from None
                raise LeaseStoreError(f"lease database {self.path} is held by another process (a second topod on "
                                      "this state dir?); topod does not share it: stop the other one") from None
            if isinstance(exc, sqlite3.DatabaseError):  # not SQLite, or damaged: left exactly as it is
                raise LeaseStoreError(f"lease database {self.path}: {exc}. topod leaves it untouched and will not "
                                      "guess which GPUs it held: repair it, or move it away to start with no "
                                      "leases") from None
            raise
        for suffix in ("-wal", "-shm"):  # SQLite has just made them, with the umask's mode
            _private_file(Path(f"{self.path}{suffix}"), create=False)
        # The file this store writes is the one the next start reads only while the path
        # still names it: an unlinked or replaced database takes commits into a deleted
        # inode and the next start finds nothing. Checked after every commit.
        self._identity = _identity(self.path)
        self.broken: str | None = None  # set once: the database is not the file at its path
        self.failing: str | None = None  # the last write's error, until a write succeeds
        # The database is the truth; the mirror spares a query per read and lets a
        # decision see changes whose commit is still in flight.
        try:
            loaded = self._load()
        except BaseException:
            self._close_quietly()
            raise
        self._cache: dict[str, Lease] = {lease.id: lease for lease in loaded}
        # lease id -> (that version of the lease, its JSON, its answer text or None)
        self._json: dict[str, tuple[Lease, dict[str, Any], str | None]] = {}
        self._holder: dict[str, str] = {address: lease.id for lease in self._cache.values()
                                         for address in lease.addresses}
        # Bumped by every change to what leases hold (the mirror, the GPUs, the CPUs), so a
        # reader can keep what it derived from them until the next one (LeaseService.free_state).
        self.generation = 0
        self._cpus: dict[int, int] = {}  # CPU -> leases holding it (an 'any' fallback may share)
        self._nics: dict[str, int] = {}  # NIC port key -> leases carrying it (shared mode: several)
        for lease in self._cache.values():
            self._hold(lease, +1)
        self._pending: list[_Op] = []
        self._unsettled: dict[asyncio.Future, _Op] = {}  # commit -> its change, until settled (on_commit)
        self._cond = threading.Condition()
        self._writer_idle = False  # the writer waits on _cond: a change must wake it
        self._wake_due: asyncio.AbstractEventLoop | None = None  # the loop _wake_writer is due on
        self._urgent = 0  # pending changes someone waits on (all but confirmations)
        self._lazy_deadline: float | None = None  # when pending confirmations alone get written
        self._closing = False
        self._writer: threading.Thread | None = None
        self.commits = 0  # transactions written (one fsync each)
        self.changes = 0  # changes they carried
        self.checkpoints = 0
        self._unchecked_commits = 0  # commits in the WAL since the last checkpoint

    # -- opening ------------------------------------------------------------------
    def _close_quietly(self) -> None:
        """A store that failed to open lets go of the file (and its lock) at once: a repaired
        file can be opened again, by this process too."""
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass

    def _migrate(self) -> None:
        db = self._db
        db.executescript(SCHEMA)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = row[0] if row else None
        if version == "1":
            db.execute("BEGIN IMMEDIATE")
            try:
                for lease_id, body in db.execute("SELECT id, body FROM leases").fetchall():
                    lease = Lease.from_json(json.loads(body))
                    db.execute("UPDATE leases SET body = ? WHERE id = ?", (json.dumps(lease.to_json()), lease_id))
                    db.executemany("INSERT INTO lease_devices VALUES (?, ?)",
                                   [(address, lease.id) for address in lease.addresses])
                db.execute("DROP TABLE IF EXISTS lease_gpus")
                db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        elif version is None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        elif version != SCHEMA_VERSION:
            raise TopodError(f"{self.path}: lease database schema {version} is newer than this topod "
                             f"({SCHEMA_VERSION}); upgrade topod or move the file away")

    def _load(self) -> list[Lease]:
        rows = self._db.execute("SELECT id, body FROM leases ORDER BY rowid").fetchall()
        leases = []
        for lease_id, body in rows:
            try:
                leases.append(Lease.from_json(json.loads(body)))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # Dropping it would free GPUs a job may still hold: refuse, say which row.
                raise TopodError(f"{self.path}: lease {lease_id!r} is unreadable ({type(exc).__name__}: {exc}); "
                                 "topod will not guess what it held. Release its GPUs by hand and delete "
                                 "the row, or move the database away") from exc
        return leases

    # -- reading (the mirror) -----------------------------------------------------
    def all(self) -> list[Lease]:
        return list(self._cache.values())

    def get(self, lease_id: str) -> Lease | None:
        return self._cache.get(lease_id)

    def holder_of(self, address: str) -> str | None:
        return self._holder.get(address)

    def leased_addresses(self) -> set[str]:
        return set(self._holder)

    def leased_cpus(self) -> set[int]:
        return set(self._cpus)

    def leased_nics(self) -> dict[str, int]:
        """NIC port key (topod.alloc.nics) -> leases carrying it, kept as leases come and go."""
        return dict(self._nics)

    def json_of(self, lease: Lease) -> dict[str, Any]:
        """The lease's JSON, built once per version of the lease."""
        cached = self._json.get(lease.id)
        if cached is not None and cached[0] is lease and cached[1] is not None:
            return cached[1]
        body = lease.to_json()
        if self._cache.get(lease.id) is lease:
            self._json[lease.id] = (lease, body, cached[2] if cached is not None and cached[0] is lease else None)
        return body

    def answer_text(self, lease: Lease) -> str | None:
        """The lease's JSON text as an answer sends it: the write's own text, or (a lease
        read back at start) encoded once here. None when the lease is not this store's
        current version or holds a non-finite number: the caller then encodes json_of,
        with null for NaN."""
        if self._cache.get(lease.id) is not lease:
            return None
        cached = self._json.get(lease.id)
        if cached is None or cached[0] is not lease:
            cached = (lease, None, None)
        if cached[2] is None:
            cached = (lease, cached[1], _answer(lease) or "")  # "": known not sendable as it is
            self._json[lease.id] = cached
        return cached[2] or None

    # -- changing -----------------------------------------------------------------
    def add(self, lease: Lease) -> asyncio.Future | None:
        taken = {address: self._holder[address] for address in lease.addresses if address in self._holder}
        if taken or lease.id in self._cache:
            raise LeaseConflictError(f"GPU(s) {sorted(taken)} already leased ({sorted(set(taken.values()))})")
        self._cache[lease.id] = lease
        for address in lease.addresses:
            self._holder[address] = lease.id
        self._hold(lease, +1)

        def undo() -> None:
            self.generation += 1
            if self._cache.pop(lease.id, None) is not None:
                self._hold(lease, -1)
            self._json.pop(lease.id, None)
            for address in lease.addresses:
                if self._holder.get(address) == lease.id:
                    del self._holder[address]

        stored, answer = _encode(lease)
        self._json[lease.id] = (lease, None, answer)  # the answer's JSON too: encoded once per lease
        return self._queue([(INSERT_LEASE, (lease.id, stored)),
                            (INSERT_DEVICES, [(a, lease.id) for a in lease.addresses])], undo)

    def update(self, lease: Lease) -> asyncio.Future | None:
        previous = self._cache.get(lease.id)
        if previous is None:
            raise KeyError(lease.id)
        if previous.addresses != lease.addresses:
            raise ValueError("a lease's GPUs never change; end it and grant another")
        self._cache[lease.id] = lease
        self.generation += 1

        def undo() -> None:
            if self._cache.get(lease.id) is lease:
                self._cache[lease.id] = previous
                self.generation += 1

        stored, answer = _encode(lease)
        self._json[lease.id] = (lease, None, answer)
        return self._queue([(UPDATE_LEASE, (stored, lease.id))], undo)

    def confirm(self, lease_id: str) -> asyncio.Future | None:
        """Mark a lease confirmed (its answer was written): one field, set in the row by
        SQLite itself, so the lease is not encoded again on the event loop for it (the
        next read encodes the new version once)."""
        previous = self._cache.get(lease_id)
        if previous is None or previous.confirmed:
            return None
        lease = replace(previous, confirmed=True)
        self._cache[lease_id] = lease

        def undo() -> None:
            if self._cache.get(lease_id) is lease:
                self._cache[lease_id] = previous

        return self._queue([(CONFIRM_LEASE, (lease_id,))], undo, lazy=True)

    def remove(self, lease_id: str) -> tuple[Lease, asyncio.Future | None] | None:
        """The lease leaves the mirror at once (no one can end it twice), but its GPUs and
        CPUs stay held until the delete is on disk: a release that fails (disk full) must
        not have handed them to anyone meanwhile, or memory and disk would disagree."""
        lease = self._cache.pop(lease_id, None)
        if lease is None:
            return None
        self.generation += 1
        self._json.pop(lease_id, None)

        def undo() -> None:
            self._cache.setdefault(lease_id, lease)
            self.generation += 1

        def freed() -> None:
            self.generation += 1
            self._hold(lease, -1)
            for address in lease.addresses:
                if self._holder.get(address) == lease_id:
                    del self._holder[address]

        return lease, self._queue([(DELETE_LEASE, (lease_id,))], undo, freed)  # its devices: ON DELETE CASCADE

    def _hold(self, lease: Lease, delta: int) -> None:
        """Count a lease's CPUs and NIC ports in (+1) or out (-1)."""
        self.generation += 1
        for held, keys in ((self._cpus, lease.cpus), (self._nics, lease_nic_keys(lease.decision.placements))):
            for key in keys:
                count = held.get(key, 0) + delta
                if count > 0:
                    held[key] = count
                else:
                    held.pop(key, None)

    def _queue(self, sql: list[tuple[str, tuple | list]], undo: Callable[[], None],
               on_success: Callable[[], None] | None = None, lazy: bool = False) -> asyncio.Future | None:
        """The future of the commit holding this change; None when there is no event loop
        (tools, tests of parts): then the change is written before this returns.
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
            op = _Op(sql, undo, None, None, on_success=on_success)
            self._write([op])
            self._check_own_file([op])
            if op.error is not None:
                undo()
                raise _failure(op.error)
            if on_success is not None:
                on_success()
            return None
        future = loop.create_future()
        op = _Op(sql, undo, future, loop, on_success=on_success)
        with self._cond:
            if self._closing:
                undo()
                raise LeaseStoreError("the lease store is closed; the change was not made")
            if self.broken is not None:
                undo()
                raise LeaseStoreError(f"{self.broken}; the change was not made")
            self._pending.append(op)
            self._unsettled[future] = op
            wake = not lazy or self._lazy_deadline is None  # a lazy one only sets the deadline
            if lazy:
                if self._lazy_deadline is None:
                    self._lazy_deadline = time.monotonic() + LAZY_SECONDS
            else:
                self._urgent += 1
            if self._writer is None:
                self._writer = threading.Thread(target=self._run_writer, name="topod-lease-writer", daemon=True)
                self._writer.start()
            elif wake and self._writer_idle and self._wake_due is not loop:
                # An idle writer is woken once this turn of the loop is over (call_soon runs
                # after every callback already due), so the changes made by the requests
                # that arrived together share its commit; a busy writer takes what is
                # pending when its commit ends. (Per loop: a loop closed before its turn
                # ended must not keep the next one from waking the writer.)
                self._wake_due = loop
                loop.call_soon(self._wake_writer)
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

    def _settle_all(self, ops: list[_Op]) -> None:
        """On the event loop: each change's future resolved (a failed one undone first),
        then its on_commit callbacks; the mirror follows the disk even when no one waits
        for the future any more."""
        for op in ops:
            if op.future is not None:
                self._unsettled.pop(op.future, None)
            _settle(op)

    def _wake_writer(self) -> None:
        with self._cond:
            self._wake_due = None
            # Confirmations alone (lazy) wake it too: it then sleeps until their deadline.
            if self._writer_idle and (self._pending or self._closing):
                self._writer_idle = False
                self._cond.notify()

    # -- the writer thread ------------------------------------------------------------
    def _run_writer(self) -> None:
        while True:
            with self._cond:
                while not self._urgent and not self._closing:
                    wait = None  # nothing pending: until a change comes
                    if self._pending:  # confirmations only: until their deadline
                        wait = self._lazy_deadline - time.monotonic()
                        if wait <= 0:
                            break
                    self._writer_idle = True
                    self._cond.wait(wait)
                self._writer_idle = False
                batch, self._pending = self._pending, []
                self._urgent, self._lazy_deadline = 0, None
                if not batch and self._closing:
                    return
            self._write(batch)
            self._check_own_file(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[_Op]] = {}
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
            if any(op.sql for op in batch):
                self._unchecked_commits += 1
            self._checkpoint_if_due()

    def _check_own_file(self, batch: list[_Op]) -> None:
        """After a write: is the database still the file at its path? If not, the batch
        went into a file no start will read: fail it (undone, the clients told) and refuse
        every later change. A failed write is remembered until one succeeds."""
        changes = [op for op in batch if op.sql]
        if not changes:
            return
        if self.broken is None:
            found = _identity(self.path)
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
        return None

    def _write(self, batch: list[_Op]) -> None:
        """One transaction for the whole batch. A change that violates a constraint fails
        alone: the batch is first written straight (the common case: its changes merged
        into a few multi-row statements, topod.service.batch_sql, each a GIL round trip of
        this thread), and only when a statement fails is it written again change by
        change, with a savepoint each. A failed COMMIT fails them all."""
        try:
            try:
                self._transaction(batch, isolate=False)
            except _StatementFailed:
                self._transaction(batch, isolate=True)
        except sqlite3.Error as exc:
            for op in batch:
                op.error = op.error or exc

    def _transaction(self, batch: list[_Op], *, isolate: bool) -> None:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            statements = None if isolate else merged(op.sql for op in batch)
            if statements is not None:
                try:
                    for statement, params in statements:
                        db.execute(statement, params)
                except sqlite3.Error as exc:
                    raise _StatementFailed from exc
            for op in batch if statements is None else ():
                if isolate:
                    db.execute("SAVEPOINT change")
                try:
                    for statement, params in op.sql:
                        if isinstance(params, list):
                            db.executemany(statement, params)
                        else:
                            db.execute(statement, params)
                except sqlite3.Error as exc:
                    if not isolate:
                        raise _StatementFailed from exc
                    db.execute("ROLLBACK TO change")
                    op.error = exc
                if isolate:
                    db.execute("RELEASE change")
            db.execute("COMMIT")
            self.commits += 1
            self.changes += len(batch)
        except (sqlite3.Error, _StatementFailed):
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise

    # -- checkpoints, between batches ---------------------------------------------------
    def _checkpoint_if_due(self) -> None:
        """Copy the WAL into the database when it is due and nothing waits (the answers
        of this batch are already on their way), or regardless when it is long overdue."""
        due = self._unchecked_commits
        if due < CHECKPOINT_EVERY_COMMITS:
            return
        with self._cond:
            waiting = bool(self._urgent)
        if waiting and due < CHECKPOINT_FORCE_COMMITS:
            return
        try:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
            self._unchecked_commits = 0
        except sqlite3.Error as exc:  # tried again after the next CHECKPOINT_EVERY_COMMITS commits
            self._unchecked_commits = 0
            log.warning("lease_checkpoint_failed", error=str(exc))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every change queued so far is on disk (or failed)."""
        with self._cond:
            if self._writer is None or not self._writer.is_alive():
                return
            marker = _Op([], lambda: None, None, None, written=threading.Event())
            self._pending.append(marker)
            self._urgent += 1
            self._cond.notify()
        marker.written.wait(timeout)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._writer is not None:
            self._writer.join(timeout=30)
        try:  # leave a short WAL behind: the next start reads less
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            pass
        self._db.close()


def _encode(lease: Lease) -> tuple[str, str | None]:
    """(the row's text, the answer's text): one encoding for both when every number is
    finite, as it always is in practice. A NaN is stored as it was (the row reads back
    the same) and the answer is left to the API, which sends null for it."""
    answer = _answer(lease)
    return (answer if answer is not None else json.dumps(lease.to_json())), answer


def _answer(lease: Lease) -> str | None:
    try:
        return lease.json_text()
    except ValueError:
        return None


class _StatementFailed(Exception):
    """A statement of a batch written without savepoints failed: write it again with them."""


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


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _private_directory(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's exist_ok covers directories only
        raise LeaseStoreError(f"state directory {directory}: exists and is not a directory") from None
    except OSError as exc:
        raise LeaseStoreError(f"state directory {directory}: cannot create it: {exc.strerror or exc}") from None
    os.chmod(directory, 0o700)  # leases name users and jobs: not for every local user


def _private_file(path: Path, *, create: bool) -> None:
    """Mode 0600 on `path`, a regular file (made when `create`); LeaseStoreError for a
    link, a FIFO, a device or a directory in its place. Nothing but a regular file is
    opened (a device can act when opened)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise LeaseStoreError(f"{path}: cannot inspect it: {exc.strerror or exc}") from None
    if found is None and not create:
        return
    if found is not None and not stat.S_ISREG(found.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else file_kind(found.st_mode)
        raise LeaseStoreError(f"{path}: {kind}, not the lease database's own file; topod will not follow or "
                              "open it: move it away")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise LeaseStoreError(f"{path}: cannot open it: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the lstat and the open
            raise LeaseStoreError(f"{path}: replaced while being opened; move it away")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
