"""On Python 3.11 asyncio.wait_for swallows a cancellation that lands while its inner
awaitable completes (CPython gh-86296, rewritten in 3.12): the cancelled loop carries on,
and the daemon's TaskGroup waited for it for ever at stop. topod uses asyncio.timeout."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import topod

PACKAGE = Path(topod.__file__).parent


def test_no_module_of_topod_calls_asyncio_wait_for():
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{number}"
                 for path in sorted(PACKAGE.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"\basyncio\.wait_for\(|\bfrom asyncio import .*\bwait_for\b", line)]
    assert offenders == []


def test_a_cancel_as_the_wait_completes_still_cancels_under_asyncio_timeout():
    """The pattern topod uses: the event is set and the task cancelled in the same loop
    step; the task must end cancelled, not go on as if it had only been woken."""
    async def scenario() -> list[str]:
        seen: list[str] = []
        due = asyncio.Event()

        async def loop_body() -> None:
            while True:
                try:
                    async with asyncio.timeout(60):
                        await due.wait()
                except TimeoutError:
                    continue
                due.clear()
                seen.append("woken")

        task = asyncio.create_task(loop_body())
        await asyncio.sleep(0)
        due.set()
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 2)  # the test's own wait: not the pattern under test
        except asyncio.CancelledError:
            seen.append("cancelled")
        except TimeoutError:
            seen.append("still running")
            task.cancel()
        return seen

    assert asyncio.run(scenario())[-1] == "cancelled"
