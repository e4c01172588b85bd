"""Test seams for the lease store (topod/service/lease_store.py and its group-commit
writer): a lease made from plain values, a GPU leased on disk behind the mirror's back,
and the writer's disk made slow or watched transaction by transaction."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

from topod.alloc.request import Decision, Performance, Placement
from topod.service.lease import Lease
from topod.service.lease_store import LeaseStore


def make_lease(lease_id: str, gpus: tuple[int, ...], *, cpus_per_gpu: int = 2) -> Lease:
    placements = tuple(Placement(index=g, address=f"0000:{0x10 + g:02x}:00.0", numa_node=g // 4,
                                 cpus=tuple(range(g * cpus_per_gpu, (g + 1) * cpus_per_gpu)), cpu_node=g // 4)
                       for g in gpus)
    decision = Decision(gpus=gpus, placements=placements, cpus={p.index: p.cpus for p in placements},
                        memory_nodes=tuple(sorted({g // 4 for g in gpus})), numa_nodes=tuple(sorted({g // 4 for g in gpus})),
                        cost=1.5, best_cost=1.5, level="best", requested_level="good", satisfaction=1.0,
                        performance=Performance(1.0, "NV18", 450.0, {"best": 1.0}), exact=True, cpu_fallback=False)
    return Lease(id=lease_id, state="active", owner_uid=1000, owner_gid=1000, requester_pid=42, owner_pid=None,
                 owner_start_time=None, job="train", priority=0, preemptible=False, decision=decision,
                 gpu_uuids=tuple(f"GPU-{g}" for g in gpus), environment={"TOPOD_LEASE": lease_id},
                 created=1000.0, expires=None, ttl_seconds=None)


def _another_writer_takes(store: LeaseStore, *addresses: str) -> None:
    """GPUs leased on disk behind the mirror's back: the next grant of any fails to commit.
    Written through the store's own connection (it holds the file's lock: no other writer
    can), while its writer thread is idle; or by a connection of its own once closed."""
    if store.writer._closing:
        db = sqlite3.connect(store.path)
    else:
        store.flush()
        db = store.writer._db
    # Under the writer's lock, as every write of the store's connection: the writer thread
    # may still be busy after the flush (its checkpoint, the WAL's reserve past the file's
    # end, which a frame appended meanwhile would lose).
    with store.writer._db_lock:
        db.execute("INSERT INTO leases VALUES ('ghost', '{}')")
        db.executemany("INSERT INTO lease_devices VALUES (?, 'ghost')", [(address,) for address in addresses])
    if db is not store.writer._db:
        db.commit()
        db.close()


async def _writer_idle(store: LeaseStore) -> None:
    """Until the writer thread waits for work again (a change queued then wakes it)."""
    while not store.writer._idle:
        await asyncio.sleep(0.001)


def _watch_transactions(store: LeaseStore, delay=lambda: 0.0, spans: list | None = None) -> list[int]:
    """The threads that write each transaction, in order; each first sleeps delay() (a
    slow disk). spans: each transaction's (start, end), in order."""
    writers: list[int] = []
    real = store.writer._transaction

    def watched(batch, *, isolate):
        writers.append(threading.get_ident())
        started = time.monotonic()
        time.sleep(delay())
        try:
            return real(batch, isolate=isolate)
        finally:
            if spans is not None:
                spans.append((started, time.monotonic()))

    store.writer._transaction = watched
    return writers
