"""GPU caps and never-satisfiable requests in the lease service (in-process, on its real
LeaseStore, the h800 fixture host: 8 GPUs, two 32-CPU NUMA nodes)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from topod.alloc.errors import GroupQuotaError, InsufficientCpusError, InsufficientGpusError, UidQuotaError
from topod.alloc.quota import GroupCap
from topod.api.peer import Caller
from topod.config import load_config
from topod.discover.scan import discover
from topod.events import EventBus
from topod.host import HostRoot
from topod.service.lease_queue import WaitTimeoutError
from topod.service.lease_store import LeaseStore
from topod.service.leases import LeaseService
from topod.service.state import HostState

ROOT = Caller(uid=0, gid=0, pid=os.getpid(), may_allocate=True, is_admin=True)
ALICE = Caller(uid=4242, gid=4242, pid=os.getpid(), may_allocate=True, is_admin=False)
BOB = Caller(uid=4343, gid=4242, pid=os.getpid(), may_allocate=True, is_admin=False)
CAROL = Caller(uid=4444, gid=4444, pid=os.getpid(), may_allocate=True, is_admin=False)


@pytest.fixture()
def make_service(host_tree, tmp_path):
    topology = discover(HostRoot(host_tree("h800-8gpu")), live_nvml=False)
    stores: list[LeaseStore] = []

    def make(**settings) -> LeaseService:
        store = LeaseStore(tmp_path / f"state{len(stores)}")
        stores.append(store)
        alloc = dict(load_config(None).section("alloc"), **settings)
        return LeaseService(HostState(topology), store, EventBus(), alloc, set())

    yield make
    for store in stores:
        store.close()


def test_eight_concurrent_requests_never_overshoot_the_uid_cap(make_service):
    service = make_service(max_gpus_per_uid=3)

    async def scenario():
        return await asyncio.gather(*(service.allocate({"gpus": 1}, ALICE) for _ in range(8)), return_exceptions=True)

    outcomes = asyncio.run(scenario())
    granted = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(granted) == 3 and len(service.leases()) == 3
    assert all(isinstance(o, UidQuotaError) and (o.held, o.asked, o.cap) == (3, 1, 3) for o in refused), refused
    assert all(o.retryable for o in refused)
    assert service.outcomes[("rejected", "uid_quota")] == 5


def test_a_grant_not_yet_committed_counts_against_the_cap(make_service):
    service = make_service(max_gpus_per_uid=2)

    async def scenario():
        lease, commit = service.start_allocation({"gpus": 2}, ALICE)
        assert commit is not None and not commit.done(), "the first grant is not on disk yet"
        with pytest.raises(UidQuotaError) as refused:
            service.start_allocation({"gpus": 1}, ALICE)
        await commit
        return refused.value

    refused = asyncio.run(scenario())
    assert (refused.held, refused.asked, refused.cap) == (2, 1, 2)


def test_other_uids_and_root_are_not_held_to_one_uids_cap(make_service):
    service = make_service(max_gpus_per_uid=2)

    async def scenario():
        await service.allocate({"gpus": 2}, ALICE)
        await service.allocate({"gpus": 2}, CAROL)
        await service.allocate({"gpus": 4}, ROOT)

    asyncio.run(scenario())
    assert sorted(lease.owner_uid for lease in service.leases()) == [0, 4242, 4444]


def test_a_request_larger_than_the_cap_is_refused_at_once_even_with_a_wait(make_service):
    service = make_service(max_gpus_per_uid=2)
    started = time.monotonic()
    with pytest.raises(UidQuotaError) as refused:
        asyncio.run(service.allocate({"gpus": 3, "wait": 30}, ALICE))
    assert time.monotonic() - started < 5
    assert refused.value.retryable is False and service.waiters == []


def test_a_waiter_over_its_cap_waits_for_its_own_release_and_preempts_no_one(make_service):
    service = make_service(max_gpus_per_uid=2)

    async def scenario():
        first = await service.allocate({"gpus": 2}, ALICE)
        waiting = asyncio.ensure_future(service.allocate({"gpus": 1, "wait": 30}, ALICE))
        await asyncio.sleep(0.2)
        assert not waiting.done() and len(service.waiters) == 1, "over its cap, with free GPUs: it waits"
        assert all(lease.state == "active" for lease in service.leases()), "nobody preempted for it"
        await service.release(first.id, ALICE)
        second = await asyncio.wait_for(waiting, 10)
        return second

    second = asyncio.run(scenario())
    assert len(second.gpus) == 1 and [lease.id for lease in service.leases()] == [second.id]


def test_a_waiter_over_its_cap_times_out_saying_so(make_service):
    service = make_service(max_gpus_per_uid=2)

    async def scenario():
        await service.allocate({"gpus": 2}, ALICE)
        return await service.allocate({"gpus": 1, "wait": 0.3}, ALICE)

    with pytest.raises(WaitTimeoutError, match=r"max_gpus_per_uid = 2 \(release 1 of them\); no room within 0.3 s"):
        asyncio.run(scenario())


def test_a_waiter_whose_cap_is_lowered_below_its_size_is_answered_at_once(make_service):
    service = make_service(max_gpus_per_uid=4)

    async def scenario():
        await service.allocate({"gpus": 4}, ALICE)
        waiting = asyncio.ensure_future(service.allocate({"gpus": 3, "wait": 30}, ALICE))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        service.configure(dict(service.settings, max_gpus_per_uid=2), service.reserved_cpus)
        service.process_queue()  # what a reload does after configure
        with pytest.raises(UidQuotaError) as refused:
            await asyncio.wait_for(waiting, 5)
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.retryable is False and service.waiters == []


def test_a_groups_members_share_its_cap(make_service):
    team = GroupCap("team", gid=4242, cap=3)
    service = make_service(max_gpus_per_group=(team,))

    async def scenario():
        await service.allocate({"gpus": 2}, ALICE)
        with pytest.raises(GroupQuotaError) as refused:
            await service.allocate({"gpus": 2}, BOB)
        await service.allocate({"gpus": 1}, BOB)
        await service.allocate({"gpus": 4}, CAROL)  # not a member
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.details == {"held": 2, "asked": 2, "cap": 3, "group": "team", "uid": BOB.uid}
    assert refused.retryable is True


@pytest.mark.parametrize(("body", "error"), [
    ({"gpus": 1, "cpus_per_gpu": 64}, InsufficientCpusError),
    ({"gpus": 1, "cpus_per_gpu": 1000, "level": "any"}, InsufficientCpusError),
    ({"gpus": 9}, InsufficientGpusError),
    ({"gpus": 1, "model": "A100"}, InsufficientGpusError),
])
def test_a_request_no_release_could_satisfy_is_refused_at_once_with_its_wait(make_service, body, error):
    service = make_service()
    started = time.monotonic()
    with pytest.raises(error) as refused:
        asyncio.run(service.allocate({**body, "wait": 3}, ALICE))
    assert time.monotonic() - started < 2, "answered at once, not after the 3 s wait"
    assert refused.value.retryable is False and service.waiters == []


def test_a_waiter_the_host_can_no_longer_serve_is_answered_when_the_reserve_grows(make_service):
    service = make_service()

    async def scenario():
        await service.allocate({"gpus": 8, "cpus_per_gpu": 0}, ROOT)
        waiting = asyncio.ensure_future(service.allocate({"gpus": 1, "cpus_per_gpu": 32, "level": "any",
                                                          "wait": 30}, ALICE))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "32 CPUs fit an empty node: it waits for a GPU"
        node_first_cpus = {min(node.cpus) for node in service.topology.numa_nodes}
        service.configure(service.settings, node_first_cpus)  # a reload that reserves a core per node
        service.process_queue()
        with pytest.raises(InsufficientCpusError) as refused:
            await asyncio.wait_for(waiting, 5)
        return refused.value

    assert asyncio.run(scenario()).retryable is False
