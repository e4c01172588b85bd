"""One group commit as one SQLite transaction: the statements the lease writer
(topod.service.lease_writer) runs for a batch of changes, on the connection it owns.

A batch is written straight first: its changes merged into a few multi-row statements
(topod.service.batch_sql), each a GIL round trip of the writer thread. When a statement
fails, the writer writes the batch again with `isolate`: change by change, each in a
savepoint, so a change that violates a constraint fails alone (its `error` set) and the
others still commit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from topod.service.batch_sql import merged

if TYPE_CHECKING:  # annotations only
    from topod.service.lease_change import QueuedChange


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
