"""A loop that stalls (stops beating, without failing) is reported once per stall, with
how long and where it hangs: its task's await chain, and the worker thread it waits on."""

from __future__ import annotations

import asyncio
import threading

from topod.service.stacks import task_where
from topod.service.watchdog import Supervisor, run_watchdog


class _Quiet:
    def watchdog(self) -> bool:
        return True

    def status(self, text: str) -> bool:
        return True


def test_newly_stalled_is_once_per_stall_and_again_after_a_beat():
    clock = [0.0]
    supervisor = Supervisor(clock=lambda: clock[0])
    supervisor.register("irq", 10.0)
    supervisor.register("probe", 100.0)
    clock[0] = 5.0
    assert supervisor.newly_stalled() == []
    clock[0] = 12.0
    assert supervisor.newly_stalled() == [("irq", 12.0, 10.0)]
    clock[0] = 30.0
    assert supervisor.newly_stalled() == [], "the same stall is not reported twice"
    supervisor.beat("irq")
    clock[0] = 41.0
    assert supervisor.newly_stalled() == [("irq", 11.0, 10.0)], "a new stall after a beat is"


async def _stuck_awaiting(event: asyncio.Event) -> None:
    await event.wait()


async def _loop_waiting_on_a_thread(release: threading.Event) -> None:
    def hang_in_thread() -> None:
        release.wait(10)

    await asyncio.to_thread(hang_in_thread)


def test_the_watchdog_names_the_stalled_loop_and_where_it_hangs():
    async def drive() -> list[tuple[str, float, float, str]]:
        supervisor = Supervisor()
        event, release = asyncio.Event(), threading.Event()
        tasks = {"events": asyncio.create_task(_stuck_awaiting(event)),
                 "thread": asyncio.create_task(_loop_waiting_on_a_thread(release))}
        for name in tasks:
            supervisor.register(name, 0.2)
        reports: list[tuple[str, float, float, str]] = []

        def on_stalled(stalled) -> None:
            reports.extend((name, seconds, deadline, task_where(tasks[name])) for name, seconds, deadline in stalled)

        watchdog = asyncio.create_task(run_watchdog(_Quiet(), supervisor, 0.05, on_stalled=on_stalled))
        await asyncio.sleep(0.8)
        event.set()
        release.set()
        watchdog.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await asyncio.gather(watchdog, return_exceptions=True)
        return reports

    reports = asyncio.run(drive())
    assert sorted(name for name, *_ in reports) == ["events", "thread"], "each stall logged once"
    where = {name: text for name, _, _, text in reports}
    assert all(seconds > deadline == 0.2 for _, seconds, deadline, _ in reports)
    assert "_stuck_awaiting" in where["events"] and "awaiting" in where["events"], where
    assert "_loop_waiting_on_a_thread" in where["thread"] and "hang_in_thread" in where["thread"], where


def test_task_where_never_raises_on_a_finished_or_missing_task():
    async def drive() -> str:
        task = asyncio.create_task(asyncio.sleep(0))
        await task
        return task_where(task)

    assert asyncio.run(drive()) == "the task has ended"
    assert task_where(None) == "no task"
