"""One group commit, as the lease writer process runs it (and the daemon itself, when it
writes in-process: topod.service.lease_writer's fallback): the only code that writes the
lease database after it is opened.

A batch is the changes (each a list of statements) queued while the last commit ran.
Every transaction also records the batch's sequence number in `meta`, in the same atomic
commit: a writer process that dies with a batch in flight leaves the question "did it
land?", and the number read back answers it exactly (topod.service.lease_writer resends
the batch when it did not, and answers its clients when it did).

Outcomes cross a pipe, so they are plain data: None for a change written, or (kind,
message) with kind CONFLICT (a constraint refused it: that change alone fails) or ERROR
(the commit failed: every change of the batch fails). A batch that commits with changes
refused records their outcomes beside its number, so the answer read back after a death
is the whole truth, not only "it landed".
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from topod.service.batch_sql import Statement, merged

CONFLICT = "conflict"
ERROR = "error"
_RECORD_BATCH = "INSERT OR REPLACE INTO meta VALUES ('last_batch', ?)"

Outcome = tuple[str, str] | None


def write_batch(db: sqlite3.Connection, sequence: int,
                changes: Sequence[Sequence[Statement]]) -> tuple[bool, list[Outcome]]:
    """One transaction for the whole batch: (committed, the outcome of each change). The batch is first
    written straight (its changes merged into a few multi-row statements,
    topod.service.batch_sql); only when a statement fails is it written again change by
    change, with a savepoint each, so a change that violates a constraint fails alone. A
    failed COMMIT fails them all, and so does a fault that is no SQLite error (a bug,
    memory): nothing raises out of here, the writer goes on with the next batch."""
    outcomes: list[Outcome] = [None] * len(changes)
    try:
        try:
            _transaction(db, sequence, changes, outcomes, isolate=False)
        except _StatementFailed:
            _transaction(db, sequence, changes, outcomes, isolate=True)
    except Exception as exc:  # noqa: BLE001 - see above: no change may wait for ever
        failure = (ERROR, _describe(exc))
        return False, [failure for _ in changes]
    return True, outcomes


def last_batch(db: sqlite3.Connection) -> tuple[int, list[Outcome] | None]:
    """(the number of the last batch committed (0 before any), the outcomes of its
    changes when any was refused, else None)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'last_batch'").fetchone()
    try:
        found = json.loads(row[0]) if row else 0
        if isinstance(found, int):
            return found, None
        sequence, outcomes = found
        return int(sequence), [None if outcome is None else (str(outcome[0]), str(outcome[1])) for outcome in outcomes]
    except (TypeError, ValueError, IndexError):  # written by hand: no batch of this daemon's is known to have landed
        return 0, None


def checkpoint(db: sqlite3.Connection, mode: str) -> str | None:
    """Copy the WAL into the database (mode PASSIVE or TRUNCATE); the error, or None."""
    try:
        db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    except sqlite3.Error as exc:
        return str(exc)
    return None


def _transaction(db: sqlite3.Connection, sequence: int, changes: Sequence[Sequence[Statement]],
                 outcomes: list[Outcome], *, isolate: bool) -> None:
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute(_RECORD_BATCH, (str(sequence),))
        # A lone change is written as it is: merging one change only costs its time.
        statements = None if isolate or len(changes) == 1 else merged(changes)
        if statements is not None:
            try:
                for statement, params in statements:
                    db.execute(statement, params)
            except sqlite3.Error as exc:
                raise _StatementFailed from exc
        for index, change in enumerate(changes if statements is None else ()):
            if isolate:
                db.execute("SAVEPOINT change")
            try:
                for statement, params in change:
                    if isinstance(params, list):
                        db.executemany(statement, params)
                    else:
                        db.execute(statement, params)
            except sqlite3.Error as exc:
                if not isolate:
                    raise _StatementFailed from exc
                db.execute("ROLLBACK TO change")
                outcomes[index] = (CONFLICT if isinstance(exc, sqlite3.IntegrityError) else ERROR, str(exc))
            if isolate:
                db.execute("RELEASE change")
        if any(outcomes):
            db.execute(_RECORD_BATCH, (json.dumps([sequence, outcomes]),))
        db.execute("COMMIT")
    except Exception:
        for index in range(len(outcomes)):  # a retry starts from a clean slate
            outcomes[index] = None
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if isinstance(exc, sqlite3.Error) and text else f"{type(exc).__name__}: {text}"


class _StatementFailed(Exception):
    """A statement of a batch written without savepoints failed: write it again with them."""
