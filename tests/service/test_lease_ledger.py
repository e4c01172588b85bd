"""The lease ledger never lies (issue 25, rows 1-5, 8, 11): a lease exists exactly when a
client was told so, and memory and disk agree after every failure.

The lease service runs in-process here, on its real LeaseStore in a temporary state dir
and a fixture host's topology, so that each race is driven to the exact step it needs."""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from topod.api.peer import Caller
from topod.config import load_config
from topod.discover.scan import discover
from topod.events import EventBus
from topod.host import HostRoot
from topod.service.lease_queue import WaitTimeoutError
from topod.service.lease_rules import PermissionDeniedError
from topod.service.lease_store import LeaseStore, LeaseStoreError
from topod.service.leases import LeaseService
from topod.service.owner import OwnerWatch
from topod.service.state import HostState

ROOT = Caller(uid=0, gid=0, pid=os.getpid(), may_allocate=True, is_admin=True)
MEMBER = Caller(uid=4242, gid=4242, pid=os.getpid(), may_allocate=True, is_admin=False)
OTHER = Caller(uid=4343, gid=4343, pid=os.getpid(), may_allocate=True, is_admin=False)


@pytest.fixture()
def ledger(host_tree, tmp_path):
    """make() -> (LeaseService, LeaseStore) on the h800 host (8 GPUs); make(restart=True)
    opens the same state dir again, as the next start of topod would."""
    topology = discover(HostRoot(host_tree("h800-8gpu")), live_nvml=False)
    made: list[LeaseStore] = []

    def make(settings: dict | None = None, clock=time.time):
        store = LeaseStore(tmp_path / "state")
        made.append(store)
        alloc = dict(load_config(None).section("alloc"), **(settings or {}))
        service = LeaseService(HostState(topology), store, EventBus(), alloc, set(), clock=clock)
        return service, store

    yield make
    for store in made:
        try:
            store.close()
        except Exception:  # noqa: BLE001 - a test may have closed it
            pass


def _on_disk(store: LeaseStore) -> set[str]:
    """The lease ids in the database file, read through the store's own connection (it
    holds the file's lock) once its writer is idle."""
    store.flush()
    return {row[0] for row in store.writer._db.execute("SELECT id FROM leases")}


# -- row 1: a grant that meets the waiter's timeout ------------------------------------
def test_a_grant_in_the_same_step_as_the_wait_timeout_is_answered_not_orphaned(ledger):
    """The holder's release commits while the waiter's deadline passes; both callbacks land
    in one loop step. The waiter was granted: it must get the lease (201), never a
    wait_timeout that leaves a lease no one was told of."""
    service, store = ledger()

    async def scenario():
        holder = await service.allocate({"gpus": 8, "level": "any", "ttl_seconds": 600}, ROOT)
        waiting = asyncio.create_task(service.allocate({"gpus": 8, "level": "any", "wait": 0.2}, ROOT))
        await asyncio.sleep(0.05)
        assert len(service.waiters) == 1

        def release_and_stall() -> None:
            # The release's commit and the waiter's deadline both complete while the loop
            # is blocked, so the next loop step sees them together.
            service.lifecycle.end(store.get(holder.id), "lease_released", reason="test")
            time.sleep(0.4)

        asyncio.get_running_loop().call_later(0.1, release_and_stall)
        return await asyncio.gather(waiting, return_exceptions=True)

    (outcome,) = asyncio.run(scenario())
    store.flush()
    leases = {lease.id for lease in store.all()}
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, WaitTimeoutError)
        assert leases == set() == _on_disk(store), "told wait_timeout, so no lease may exist"
    else:
        assert leases == {outcome.id} == _on_disk(store), "told 201: exactly that lease exists"
    assert service.waiters == []


def test_a_waiter_cancelled_after_its_grant_gives_the_grant_back(ledger):
    service, store = ledger()

    async def scenario():
        holder = await service.allocate({"gpus": 8, "level": "any", "ttl_seconds": 600}, ROOT)
        waiting = asyncio.create_task(service.allocate({"gpus": 8, "level": "any", "wait": 30}, ROOT))
        await asyncio.sleep(0.05)
        await service.release(holder.id, ROOT)
        waiting.cancel()  # the client hung up in the step its grant was made
        await asyncio.gather(waiting, return_exceptions=True)
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    store.flush()
    assert store.all() == [] and _on_disk(store) == set() and store.leased_addresses() == set()


def test_an_answer_that_cannot_be_delivered_takes_the_lease_back(ledger):
    service, store = ledger()

    async def scenario():
        lease = await service.allocate({"gpus": 2, "level": "any"}, ROOT)
        service.answered(lease, delivered=False)
        await asyncio.sleep(0.05)
        return lease

    asyncio.run(scenario())
    store.flush()
    assert store.all() == [] and _on_disk(store) == set()


# -- row 5: committed but never answered ----------------------------------------------
def test_an_ownerless_lease_is_confirmed_once_its_answer_is_written(ledger):
    service, store = ledger()

    async def scenario():
        lease = await service.allocate({"gpus": 1, "level": "any"}, ROOT)
        assert lease.confirmed is False, "neither ttl nor owner: unconfirmed until answered"
        service.answered(lease, delivered=True)
        await asyncio.sleep(0.05)
        with_ttl = await service.allocate({"gpus": 1, "level": "any", "ttl_seconds": 60}, ROOT)
        assert with_ttl.confirmed is True, "a ttl ends it anyway: nothing to confirm"
        return lease.id

    lease_id = asyncio.run(scenario())
    store.flush()
    assert store.get(lease_id).confirmed is True


def test_an_unanswered_lease_after_a_crash_ends_after_the_grace_unless_renewed(ledger):
    """A crash between the commit and the answer (simulated: the answer never written)
    leaves an unconfirmed lease. The next start keeps it for unconfirmed_grace_seconds,
    says so, and ends it after; a renew by its holder keeps it for good."""
    now = [1000.0]
    service, store = ledger(clock=lambda: now[0])

    async def grant():
        lost = await service.allocate({"gpus": 1, "level": "any", "job": "lost"}, ROOT)
        claimed = await service.allocate({"gpus": 1, "level": "any", "job": "claimed"}, ROOT)
        return lost, claimed

    lost, claimed = asyncio.run(grant())
    store.close()

    service, store = ledger({"unconfirmed_grace_seconds": 120.0}, clock=lambda: now[0])

    async def restart():
        service.recover()
        await asyncio.sleep(0.05)
        assert store.get(lost.id).expires == pytest.approx(1120.0)
        await service.renew(claimed.id, MEMBER if False else ROOT, None)
        now[0] = 1121.0
        ended = service.reap()
        await asyncio.sleep(0.05)
        return ended

    ended = asyncio.run(restart())
    store.flush()
    assert [lease.id for lease in ended] == [lost.id]
    assert {lease.id for lease in store.all()} == {claimed.id} == _on_disk(store)
    kept = store.get(claimed.id)
    assert kept.confirmed is True and kept.expires is None, "renewed: permanent again"


# -- row 3: a release that fails while a waiter wants the GPU ---------------------------
class _FailingWrites:
    """Makes the store's next transactions fail as a full disk would."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.original = store.writer._transaction

    def __enter__(self):
        def refuse(batch, *, isolate):
            raise sqlite3.OperationalError("database or disk is full")

        self.store.writer._transaction = refuse
        return self

    def __exit__(self, *exc):
        self.store.writer._transaction = self.original


def test_a_failed_release_keeps_memory_and_disk_identical_and_grants_nothing(ledger):
    service, store = ledger()

    async def scenario():
        holder = await service.allocate({"gpus": 8, "level": "any", "ttl_seconds": 600}, ROOT)
        waiting = asyncio.create_task(service.allocate({"gpus": 1, "level": "any", "wait": 1.0}, ROOT))
        await asyncio.sleep(0.05)
        with _FailingWrites(store):
            with pytest.raises(LeaseStoreError):
                await service.release(holder.id, ROOT)
        assert store.get(holder.id) is not None, "the release failed: the lease is still there"
        assert service.free_gpus() == 0
        outcome = await asyncio.gather(waiting, return_exceptions=True)
        return holder, outcome[0]

    holder, outcome = asyncio.run(scenario())
    store.flush()
    assert isinstance(outcome, WaitTimeoutError), "the GPU never became free"
    assert {lease.id for lease in store.all()} == {holder.id} == _on_disk(store)
    assert store.problem() is None or "disk is full" in store.problem()


def test_a_failed_write_shows_in_problem_until_a_write_succeeds(ledger):
    service, store = ledger()

    async def scenario():
        with _FailingWrites(store):
            with pytest.raises(LeaseStoreError):
                await service.allocate({"gpus": 1, "level": "any"}, ROOT)
        assert "disk is full" in store.problem()
        await service.allocate({"gpus": 1, "level": "any", "ttl_seconds": 60}, ROOT)
        assert store.problem() is None

    asyncio.run(scenario())


# -- row 4: the database unlinked or replaced under the daemon --------------------------
@pytest.mark.parametrize("how", ["unlinked", "replaced"])
def test_a_database_removed_under_the_store_is_rebuilt_before_the_next_answer(ledger, tmp_path, how):
    service, store = ledger()

    async def scenario():
        kept = await service.allocate({"gpus": 1, "level": "any", "ttl_seconds": 60}, ROOT)
        os.unlink(store.path)
        if how == "replaced":
            sqlite3.connect(store.path).close()
        later = await service.allocate({"gpus": 1, "level": "any", "ttl_seconds": 60}, ROOT)
        return kept, later

    kept, later = asyncio.run(scenario())
    assert store.problem() is None and store.writer.rebuilds == 1
    assert _on_disk(store) == {kept.id, later.id}
    store.close()
    db = sqlite3.connect(store.path)  # what the next start reads, through a connection of its own
    try:
        assert {row[0] for row in db.execute("SELECT id FROM leases")} == {kept.id, later.id}
    finally:
        db.close()


# -- row 2: owner tracking that fails safe -------------------------------------------
@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENOSYS, errno.EPERM])
def test_a_pidfd_failure_other_than_esrch_keeps_the_owner_lease(ledger, code):
    service, store = ledger()

    def failing_pidfd(pid: int) -> int:
        raise OSError(code, os.strerror(code))

    service.lifecycle.owner_watch = OwnerWatch(service.lifecycle.owner_exited, pidfd_open=failing_pidfd)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        async def scenario():
            lease = await service.allocate({"gpus": 1, "level": "any", "owner_pid": owner.pid}, ROOT)
            await asyncio.sleep(0.1)
            assert store.get(lease.id) is not None, "the owner is alive: the lease stays"
            assert service.reap() == []
            owner.kill()
            owner.wait()
            ended = service.reap()  # the fallback: the reaper's check of pid and start time
            await asyncio.sleep(0.05)
            return lease, ended

        lease, ended = asyncio.run(scenario())
        assert [item.id for item in ended] == [lease.id]
    finally:
        owner.kill()
        owner.wait()


def test_a_vanished_owner_still_ends_its_lease_at_once(ledger):
    service, store = ledger()

    def gone(pid: int) -> int:
        raise ProcessLookupError(errno.ESRCH, "No such process")

    service.lifecycle.owner_watch = OwnerWatch(service.lifecycle.owner_exited, pidfd_open=gone)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        async def scenario():
            lease = await service.allocate({"gpus": 1, "level": "any", "owner_pid": owner.pid}, ROOT)
            await asyncio.sleep(0.1)
            return lease

        lease = asyncio.run(scenario())
        store.flush()
        assert store.get(lease.id) is None
    finally:
        owner.kill()
        owner.wait()


# -- row 8: authorization by what the caller holds --------------------------------------
def test_owner_pid_must_be_the_caller_or_its_descendant_unless_root(ledger):
    service, store = ledger()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    # Someone else's process (not the caller's, not pid 1: the test's own parent may be
    # init when it runs detached): a sibling of the stranger.
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        not_mine = Caller(uid=4242, gid=4242, pid=stranger.pid, may_allocate=True, is_admin=False)

        async def scenario():
            with pytest.raises(PermissionDeniedError, match="descendants"):
                await service.allocate({"gpus": 1, "level": "any", "owner_pid": sibling.pid}, not_mine)
            with pytest.raises(PermissionDeniedError, match="never exits"):
                await service.allocate({"gpus": 1, "level": "any", "owner_pid": 1}, ROOT)
            with pytest.raises(PermissionDeniedError, match="never exits"):
                await service.allocate({"gpus": 1, "level": "any", "owner_pid": os.getpid()},
                                       Caller(uid=0, gid=0, pid=stranger.pid, may_allocate=True, is_admin=True))
            # the caller's own child is fine, for a member too
            return await service.allocate({"gpus": 1, "level": "any", "owner_pid": stranger.pid}, MEMBER)

        # MEMBER's pid is this test process, the stranger's parent
        lease = asyncio.run(scenario())
        assert lease.owner_pid == stranger.pid and lease.owner_uid == MEMBER.uid
    finally:
        for process in (stranger, sibling):
            process.kill()
            process.wait()


def test_a_priority_above_the_ceiling_needs_root(ledger):
    service, store = ledger({"max_priority_non_root": 5})

    async def scenario():
        with pytest.raises(PermissionDeniedError, match="max_priority_non_root"):
            await service.allocate({"gpus": 1, "level": "any", "priority": 1_000_000, "ttl_seconds": 60}, MEMBER)
        member = await service.allocate({"gpus": 1, "level": "any", "priority": 5, "ttl_seconds": 60}, MEMBER)
        root = await service.allocate({"gpus": 1, "level": "any", "priority": 1_000_000, "ttl_seconds": 60}, ROOT)
        return member, root

    member, root = asyncio.run(scenario())
    assert member.priority == 5 and root.priority == 1_000_000
    assert len(store.all()) == 2, "the refused request left nothing"


def test_telemetry_is_accepted_only_for_links_of_the_callers_own_leases(ledger):
    from topod.probe.backend import LinkId

    service, store = ledger()

    async def scenario():
        return await service.allocate({"gpus": 2, "level": "any", "ttl_seconds": 60}, MEMBER)

    lease = asyncio.run(scenario())
    a, b = lease.addresses
    others = [gpu.address for gpu in service.topology.gpus if gpu.address not in lease.addresses]
    assert service.telemetry_authority(ROOT) is None, "root may report any link"
    mine = service.telemetry_authority(MEMBER)
    mine(LinkId("p2p", a, b))
    mine(LinkId("h2d", f"node{lease.memory_nodes[0]}", a))
    with pytest.raises(PermissionDeniedError, match="only root"):
        mine(LinkId("p2p", a, others[0]))
    with pytest.raises(PermissionDeniedError):
        service.telemetry_authority(OTHER)(LinkId("p2p", a, b))


# -- row 11: a fault while granting a queued request ---------------------------------
def test_a_fault_granting_a_waiter_fails_that_waiter_not_the_releasing_client(ledger, monkeypatch):
    service, store = ledger()

    async def scenario():
        holder = await service.allocate({"gpus": 8, "level": "any", "ttl_seconds": 600}, ROOT)
        waiting = asyncio.create_task(service.allocate({"gpus": 1, "level": "any", "wait": 5}, ROOT))
        await asyncio.sleep(0.05)

        def broken_grant(*args, **kwargs):
            raise RuntimeError("two GPUs share index 3")

        monkeypatch.setattr(service, "_grant", broken_grant)
        released = await service.release(holder.id, ROOT)  # must not raise
        outcome = await asyncio.gather(waiting, return_exceptions=True)
        return released, outcome[0]

    released, outcome = asyncio.run(scenario())
    assert released.state == "active" and store.get(released.id) is None
    assert isinstance(outcome, Exception) and "index 3" in str(outcome)
    assert service.waiters == []


def test_a_confirmation_sets_one_field_on_disk_and_in_memory(ledger):
    service, store = ledger()

    async def scenario():
        lease = await service.allocate({"gpus": 1, "level": "any", "job": "j"}, ROOT)
        before = store.json_of(store.get(lease.id))
        service.answered(lease, delivered=True)
        await asyncio.sleep(0.05)
        return lease, before

    lease, before = asyncio.run(scenario())
    store.flush()
    (row,) = store.writer._db.execute("SELECT body FROM leases WHERE id = ?", (lease.id,)).fetchone()
    import json

    on_disk = json.loads(row)
    assert on_disk["confirmed"] is True and before["confirmed"] is False
    assert {k: v for k, v in on_disk.items() if k != "confirmed"} == {k: v for k, v in before.items()
                                                                       if k != "confirmed"}
    assert store.get(lease.id).confirmed is True and store.json_of(store.get(lease.id))["confirmed"] is True
    assert store.answer_text(store.get(lease.id)) is not None
