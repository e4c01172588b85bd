"""The event bus: history and subscribers at once, listeners once the publishing callback
is over (an answer written in that callback goes out before its log line is rendered)."""

from __future__ import annotations

import asyncio

import pytest

from topod.events import EventBus


def test_without_a_loop_listeners_run_at_once():
    bus, told = EventBus(), []
    bus.add_listener(told.append)
    bus.publish("lease_granted", lease="a")
    assert [r["event"] for r in told] == ["lease_granted"]


def test_on_a_loop_listeners_run_after_the_publishing_callback_in_order():
    bus, told = EventBus(), []
    bus.add_listener(lambda record: told.append(record["lease"]))

    async def main() -> list[str]:
        bus.publish("lease_granted", lease="a")
        bus.publish("lease_released", lease="b")
        seen_at_once = list(told)
        assert [r["lease"] for r in bus.recent()] == ["a", "b"], "history is at once"
        assert bus.counts == {"lease_granted": 1, "lease_released": 1}
        await asyncio.sleep(0)
        return seen_at_once

    assert asyncio.run(main()) == []
    assert told == ["a", "b"]


def test_subscribers_get_the_record_at_once():
    bus = EventBus()

    async def main() -> dict:
        queue = bus.subscribe()
        bus.publish("lease_granted", lease="a")
        return queue.get_nowait()

    assert asyncio.run(main())["lease"] == "a"


@pytest.mark.parametrize("error", [RuntimeError, asyncio.CancelledError])  # CancelledError: no Exception
def test_a_failing_listener_neither_reaches_the_publisher_nor_silences_the_others(error):
    bus, told = EventBus(), []

    def broken(record):
        raise error("listener bug")

    bus.add_listener(broken)
    bus.add_listener(lambda record: told.append(record["event"]))

    async def main() -> None:
        bus.publish("lease_granted", lease="a")  # does not raise
        bus.publish("lease_released", lease="a")
        await asyncio.sleep(0)

    asyncio.run(main())
    assert told == ["lease_granted", "lease_released"]


def test_a_loop_closed_before_its_drain_does_not_silence_the_next_one():
    bus, told = EventBus(), []
    bus.add_listener(lambda record: told.append(record["lease"]))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.sleep(0))

    async def publish_only(lease: str) -> None:
        bus.publish("lease_granted", lease=lease)

    # The drain is scheduled but the loop closes before it runs...
    loop.run_until_complete(publish_only("first"))
    loop.close()
    assert told in ([], ["first"])

    async def publish_and_yield() -> None:
        bus.publish("lease_granted", lease="second")
        await asyncio.sleep(0)

    # ...and the next loop still drains, the earlier record first.
    asyncio.run(publish_and_yield())
    assert told == ["first", "second"]


def test_drain_runs_what_is_still_due():
    bus, told = EventBus(), []
    bus.add_listener(lambda record: told.append(record["event"]))

    async def main() -> None:
        bus.publish("lease_revoked", lease="a")
        bus.drain()  # as the daemon does before its last log line
        assert told == ["lease_revoked"]

    asyncio.run(main())
    assert told == ["lease_revoked"], "told once"


def test_a_log_that_fails_on_a_record_loses_no_other_record(monkeypatch):
    """The log is a listener too: if rendering a record fails, so may the log line saying
    so; the records after it are still told."""
    from topod import events

    bus, told = EventBus(), []

    def broken_log(record):
        raise TypeError("unrenderable")

    def failing_exception_log(*args, **kwargs):
        raise TypeError("the log cannot render either")

    monkeypatch.setattr(events.log, "exception", failing_exception_log)
    bus.add_listener(lambda record: told.append(record["lease"]))
    bus.add_listener(broken_log)

    async def main() -> None:
        for lease in ("a", "b", "c"):
            bus.publish("lease_granted", lease=lease)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert told == ["a", "b", "c"]
