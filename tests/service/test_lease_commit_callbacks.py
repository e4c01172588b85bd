"""on_commit, the path of a change's answer: its callback runs in the callback that
settles the commit (before anything the settling scheduled), sees a failed commit's
error after the undo, is still called for a settled or foreign future, and one that
raises is reported while the rest of its batch still settles."""

from __future__ import annotations

import asyncio

import pytest

from tests.service.lease_store_helpers import _another_writer_takes, make_lease
from topod.service.lease_store import LeaseConflictError, LeaseStore


def test_on_commit_runs_in_the_callback_that_settles_the_commit(tmp_path):
    """on_commit's callback sees its commit done and runs before anything the settling
    scheduled (add_done_callback's callbacks run a loop turn later): the answer path."""
    store = LeaseStore(tmp_path)
    seen: list[tuple[str, bool, bool]] = []

    async def scenario():
        commit = store.add(make_lease("a", (0,)))
        commit.add_done_callback(lambda f: seen.append(("done_callback", f.done(), store.holder_of("0000:10:00.0") == "a")))
        store.on_commit(commit, lambda f: seen.append(("on_commit", f.done(), f.exception() is None)))
        await commit

    asyncio.run(scenario())
    assert seen == [("on_commit", True, True), ("done_callback", True, True)]
    store.close()


def test_on_commit_of_a_failed_commit_sees_the_error_after_the_undo(tmp_path):
    store = LeaseStore(tmp_path)
    seen = []

    async def scenario():
        store.add(make_lease("a", (0,)))
        _another_writer_takes(store, "0000:11:00.0")
        commit = store.add(make_lease("b", (1,)))
        store.on_commit(commit, lambda f: seen.append((type(f.exception()).__name__, store.get("b"))))
        with pytest.raises(LeaseConflictError):
            await commit

    asyncio.run(scenario())
    assert seen == [("LeaseConflictError", None)], "told the error, the change already undone"
    store.close()


@pytest.mark.parametrize("error", [RuntimeError, asyncio.CancelledError])  # CancelledError: no Exception
def test_a_failing_on_commit_callback_is_reported_and_the_batch_still_settles(tmp_path, error):
    store = LeaseStore(tmp_path)
    reported, told = [], []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        await store.add(make_lease("warm", (7,)))  # the writer is idle: the next two are one batch
        first, second = store.add(make_lease("a", (0,))), store.add(make_lease("b", (1,)))

        def broken(_):
            raise error("callback bug")

        store.on_commit(first, broken)
        store.on_commit(first, lambda f: told.append("first, after the broken one"))
        store.on_commit(second, lambda f: told.append("second"))
        await asyncio.gather(first, second)

    asyncio.run(scenario())
    assert told == ["first, after the broken one", "second"]
    assert [str(c["exception"]) for c in reported] == ["callback bug"]
    assert {lease.id for lease in store.all()} == {"warm", "a", "b"}
    store.close()


def test_on_commit_of_a_settled_or_foreign_future_still_calls_back(tmp_path):
    store = LeaseStore(tmp_path)
    seen = []

    async def scenario():
        commit = store.add(make_lease("a", (0,)))
        await commit
        store.on_commit(commit, lambda f: seen.append("settled: at once"))
        assert seen == ["settled: at once"]
        foreign = asyncio.get_running_loop().create_future()
        store.on_commit(foreign, lambda f: seen.append("foreign: when it resolves"))
        foreign.set_result(None)
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert seen == ["settled: at once", "foreign: when it resolves"]
    assert not store.writer._unsettled, "nothing kept once settled"
    store.close()
