"""The lease store: the leases the daemon holds, in memory and on disk.

The in-memory mirror changes at once, on the event loop, so decisions always see it; each
change is queued to the group-commit writer (topod.service.lease_writer) and returns a
future that resolves when the transaction holding it is on disk, and the API answers only
after that. A failed commit undoes its change in the mirror. The database itself (the file
in the state dir, its schema, the leases read back at start) is topod.service.lease_db.

A GPU (by PCI address) is in at most one lease: the mirror refuses a conflicting lease
before it is queued, and the lease_devices primary key refuses it again on disk.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from topod.alloc.nics import lease_nic_keys
from topod.service.lease import Lease
from topod.service.lease_db import (LeaseConflictError, LeaseStoreError, LeaseStoreFullError, close_quietly,
                                    load_leases, open_database)
from topod.service.lease_writer import (CONFIRM_LEASE, DELETE_LEASE, INSERT_DEVICES, INSERT_LEASE, UPDATE_LEASE,
                                        GroupCommitWriter)

# Defined with the file (topod.service.lease_db); the rest of the daemon imports them from here.
# A confirmation the disk refused is queued again after this long (see confirm).
CONFIRM_RETRY_SECONDS = 1.0

__all__ = ["LeaseConflictError", "LeaseStore", "LeaseStoreError", "LeaseStoreFullError"]


class LeaseStore:
    def __init__(self, state_dir: str | Path, synchronous: str = "full") -> None:
        """synchronous: "full" (the default: a lease survives power loss once answered) or
        "normal" (WAL: survives a crash of topod or the OS, may lose the last commits on
        power loss; fewer fsyncs)."""
        self.path, db = open_database(state_dir, synchronous)
        self.writer = GroupCommitWriter(self.path, db, synchronous)
        # on_commit is on the path of every answer: the writer's own method, no wrapper.
        self.on_commit = self.writer.on_commit
        # The database is the truth; the mirror spares a query per read and lets a
        # decision see changes whose commit is still in flight.
        try:
            loaded = load_leases(db, self.path)
        except BaseException:
            close_quietly(db)
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

    # -- the writer's state, read through the store ----------------------------------
    @property
    def commits(self) -> int:
        """Transactions written (one fsync each)."""
        return self.writer.commits

    @property
    def changes(self) -> int:
        """Changes the commits carried."""
        return self.writer.changes

    def problem(self) -> str | None:
        """Why lease writes fail now (health and STATUS= say it), or None."""
        return self.writer.problem()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every change queued so far is on disk (or failed)."""
        self.writer.flush(timeout)

    def close(self) -> None:
        """Write what is pending, stop the writer thread, close the database."""
        self.writer.close()

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
        if self.writer.space_low is not None:
            # Refused before releases are: a release frees room, a grant takes it.
            raise LeaseStoreFullError(f"lease not granted: {self.writer.space_low}; releases still work, "
                                      "grants resume once there is room")
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
        return self.writer.queue([(INSERT_LEASE, (lease.id, stored)),
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
        return self.writer.queue([(UPDATE_LEASE, (stored, lease.id))], undo)

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
                # Its client was told: an unconfirmed row would end the lease after a crash's
                # grace. Tried again with the next commit until the disk takes it.
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return
                loop.call_later(CONFIRM_RETRY_SECONDS, self.confirm, lease_id)

        return self.writer.queue([(CONFIRM_LEASE, (lease_id,))], undo, lazy=True)

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

        return lease, self.writer.queue([(DELETE_LEASE, (lease_id,))], undo, freed)  # its devices: ON DELETE CASCADE

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
