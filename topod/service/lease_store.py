"""The lease store: SQLite in the state dir, the only allocation state that survives.

WAL with synchronous=FULL: a lease is on disk before the API answers. A GPU can be in at
most one lease: the lease_gpus table's primary key makes a double grant impossible even
if the engine erred.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path

from topod.errors import TopodError

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lease_gpus (
    gpu INTEGER PRIMARY KEY,
    lease_id TEXT NOT NULL REFERENCES leases(id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SCHEMA_VERSION = "1"


class LeaseConflictError(TopodError):
    code = "gpu_already_leased"


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    state: str  # active | preempting
    owner_uid: int
    owner_gid: int
    requester_pid: int | None
    owner_pid: int | None  # the lease ends when this process exits
    job: str | None
    priority: int
    preemptible: bool
    gpus: tuple[int, ...]
    cpus: tuple[int, ...]
    memory_nodes: tuple[int, ...]
    created: float  # wall-clock seconds
    expires: float | None  # wall-clock seconds; None = no ttl
    ttl_seconds: float | None
    decision: dict
    preempt_deadline: float | None = None

    def to_json(self) -> dict:
        body = asdict(self)
        for key in ("gpus", "cpus", "memory_nodes"):
            body[key] = list(body[key])
        return body

    @classmethod
    def from_json(cls, body: dict) -> Lease:
        data = dict(body)
        for key in ("gpus", "cpus", "memory_nodes"):
            data[key] = tuple(data[key])
        return cls(**data)


class LeaseStore:
    def __init__(self, state_dir: str | Path) -> None:
        directory = Path(state_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "leases.sqlite3"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        # The database is the truth; this mirror only spares a query and a JSON parse per read.
        self._cache: dict[str, Lease] = {lease.id: lease for lease in self._load()}

    def close(self) -> None:
        self._db.close()

    def _load(self) -> list[Lease]:
        rows = self._db.execute("SELECT body FROM leases ORDER BY rowid").fetchall()
        return [Lease.from_json(json.loads(body)) for (body,) in rows]

    def all(self) -> list[Lease]:
        return list(self._cache.values())

    def get(self, lease_id: str) -> Lease | None:
        return self._cache.get(lease_id)

    def add(self, lease: Lease) -> None:
        try:
            with self._transaction():
                self._db.execute("INSERT INTO leases VALUES (?, ?)", (lease.id, json.dumps(lease.to_json())))
                self._db.executemany("INSERT INTO lease_gpus VALUES (?, ?)", [(g, lease.id) for g in lease.gpus])
        except sqlite3.IntegrityError as exc:
            raise LeaseConflictError(f"GPU(s) {list(lease.gpus)} already leased: {exc}") from exc
        self._cache[lease.id] = lease

    def update(self, lease: Lease) -> None:
        with self._transaction():
            cursor = self._db.execute("UPDATE leases SET body = ? WHERE id = ?",
                                      (json.dumps(lease.to_json()), lease.id))
            if cursor.rowcount != 1:
                raise KeyError(lease.id)
        self._cache[lease.id] = lease

    def remove(self, lease_id: str) -> Lease | None:
        lease = self.get(lease_id)
        if lease is None:
            return None
        with self._transaction():
            self._db.execute("DELETE FROM lease_gpus WHERE lease_id = ?", (lease_id,))
            self._db.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
        self._cache.pop(lease_id, None)
        return lease

    def _transaction(self):
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, value, traceback) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")
