"""What the cyclic collector would have had to free while a piece of code ran (tests of
issue 26's lease path, which must leave none of its own)."""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def garbage_after(run: Callable[[], T]) -> tuple[T, collections.Counter]:
    """(run's result, type name -> count of the objects left in reference cycles by it):
    collected before, the collector off while it runs, then one collection that keeps what
    it finds (gc.DEBUG_SAVEALL) instead of freeing it."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        result = run()
        gc.collect()
        left = collections.Counter(type(item).__name__ for item in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return result, left
