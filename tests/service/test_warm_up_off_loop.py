"""engine.prepare runs in a worker thread (issue 26): while it runs, decisions on the loop
are still answered; when it ends, its view (per-size references filled) is swapped in on
the loop, unless the topology changed meanwhile.

The lease service runs in-process on its real LeaseStore and the h800 host (8 GPUs);
prepare is held in its thread by an Event, so the race is driven, not timed."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

import topod.alloc.engine as engine
from topod.api.peer import Caller
from topod.record import replace

ROOT = Caller(uid=0, gid=0, pid=os.getpid(), may_allocate=True, is_admin=True)


@pytest.fixture()
def held_prepare(monkeypatch):
    """prepare waits in its thread until go is set; prepared holds the views it built."""
    started, go = threading.Event(), threading.Event()
    prepared: list = []
    real = engine.prepare

    def held(*args, **kwargs):
        started.set()
        assert go.wait(10), "the test never let prepare go on"
        view = real(*args, **kwargs)
        prepared.append(view)
        return view

    monkeypatch.setattr(engine, "prepare", held)
    return started, go, prepared


def _references(view) -> set:
    return {key for key in view.cache if isinstance(key, tuple) and key[0] == "ref"}


def test_decisions_are_answered_while_prepare_runs_and_its_view_is_swapped_in_after(service, held_prepare):
    started, go, prepared = held_prepare

    async def scenario():
        warming = asyncio.create_task(service.warm_up())
        assert await asyncio.to_thread(started.wait, 10), "prepare never started"
        # prepare is held in its thread: the loop still decides and grants
        lease = await service.allocate({"gpus": 2, "level": "any", "ttl_seconds": 600}, ROOT)
        assert len(lease.decision.gpus) == 2 and not warming.done()
        meanwhile = service.distances.memo["host_view"]
        assert not prepared, "the decision did not wait for prepare"
        go.set()
        assert await warming is True
        return meanwhile

    meanwhile = asyncio.run(scenario())
    view = service.distances.memo["host_view"]
    assert prepared and view is prepared[0], "the prepared view is the one decisions now use"
    assert view is not meanwhile and view.topology is service.topology
    # every size 1-8 of the host has its reference, census and node limit: a first decision
    # per size computes none of them
    assert {("ref", k, None, ()) for k in range(1, 9)} <= _references(view)
    assert {("node_limit", k) for k in range(1, 9)} <= set(view.cache) and "census" in view.cache
    # what the decision made meanwhile cached in the old view is kept
    assert set(meanwhile.cache) <= set(view.cache)


def test_a_first_decision_of_each_size_after_warm_up_computes_no_reference(service, monkeypatch):
    asyncio.run(service.warm_up())
    view = service.distances.memo["host_view"]
    before = _references(view)
    searched: list[int] = []
    real_reference = engine.reference_set

    def counted(view, k, *args):
        if ("ref", k, None, ()) not in view.cache:
            searched.append(k)
        return real_reference(view, k, *args)

    monkeypatch.setattr(engine, "reference_set", counted)
    for k in (1, 2, 4, 8, 3):
        decision = service.decide(service.parse({"gpus": k, "level": "any"})[1])
        assert len(decision.gpus) == k
    assert searched == [] and _references(service.distances.memo["host_view"]) == before


def test_a_warm_up_overtaken_by_new_hardware_swaps_nothing_in(service, held_prepare):
    started, go, prepared = held_prepare
    old_distances = service.distances

    async def scenario():
        warming = asyncio.create_task(service.warm_up())
        assert await asyncio.to_thread(started.wait, 10)
        fewer = replace(service.topology, gpus=service.topology.gpus[:4])
        assert service.state.set_discovered(fewer) is True
        go.set()
        return await warming

    assert asyncio.run(scenario()) is False
    assert prepared and prepared[0].distances is old_distances
    assert service.distances is not old_distances
    assert service.distances.memo.get("host_view") is None, "no view of the old topology reaches the new model"
    # a decision on the new hardware builds its own view, of 4 GPUs
    decision = service.decide(service.parse({"gpus": 4, "level": "any"})[1])
    assert len(decision.gpus) == 4 and service.distances.memo["host_view"].n == 4


def test_prepare_with_fresh_leaves_the_models_own_view_alone(service):
    topology, distances = service.topology, service.distances
    own = engine.host_view(topology, distances)
    view = engine.prepare(topology, distances, fresh=True)
    assert view is not own and distances.memo["host_view"] is own and not _references(own)
    assert _references(view)
