"""Where a stalled loop is: the await chain of its asyncio task (innermost last) and, when
it waits on a worker thread, what the busy worker threads are doing. Read-only, for the
`loop_stalled` log line; never raises."""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from types import FrameType

MAX_FRAMES = 12


def task_where(task: asyncio.Task | None) -> str:
    """'file:line in function' per await level of `task`, then the busy threads' stacks."""
    if task is None:
        return "no task"
    if task.done():
        return "the task has ended"
    lines: list[str] = []
    awaited: object = task.get_coro()
    for _ in range(64):
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None) or getattr(
            awaited, "ag_frame", None)
        if frame is None:
            break
        lines.append(_frame_line(frame))
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None) or getattr(
            awaited, "ag_await", None)
    if awaited is not None and not hasattr(awaited, "cr_frame"):
        lines.append(f"awaiting {type(awaited).__name__}")
    where = " <- ".join(reversed(lines[-MAX_FRAMES:])) or "unknown"
    busy = busy_threads()
    return where + (f"; busy threads: {busy}" if busy else "")


def busy_threads() -> str:
    """The innermost frames of each executor thread running a work item (asyncio.to_thread,
    run_in_executor); idle pool threads, parked on the executor's queue, are left out."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 - the documented way to see other threads
        stack = traceback.extract_stack(frame)
        if ident == threading.get_ident() or not _running_work(stack):
            continue
        parts.append(f"[{names.get(ident, ident)}] " + " <- ".join(
            f"{_short(entry.filename)}:{entry.lineno} in {entry.name}" for entry in reversed(stack[-4:])))
    return "; ".join(parts)


def _running_work(stack: traceback.StackSummary) -> bool:
    return any(entry.name == "run" and entry.filename.endswith("concurrent/futures/thread.py") for entry in stack)


def _frame_line(frame: FrameType) -> str:
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _short(path: str) -> str:
    marker = "/topod/"
    index = path.rfind(marker)
    return path[index + 1:] if index >= 0 else path.rsplit("/", 2)[-1] if "/" in path else path
