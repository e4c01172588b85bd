"""topod.service.heap: what lives is frozen out of the collector's scans, garbage is not."""

import gc
import weakref

from topod.service.heap import freeze_long_lived


class Node:
    def __init__(self) -> None:
        self.other = None


def test_live_objects_are_frozen_and_cyclic_garbage_is_collected_first():
    kept = [Node() for _ in range(100)]
    cycle_a, cycle_b = Node(), Node()
    cycle_a.other, cycle_b.other = cycle_b, cycle_a  # garbage only the collector can free
    gone = weakref.ref(cycle_a)
    del cycle_a, cycle_b
    before = gc.get_freeze_count()
    try:
        freeze_long_lived("test")
        assert gone() is None, "a garbage cycle was frozen: it would never be freed"
        assert gc.get_freeze_count() >= before + len(kept)
        # a full collection no longer walks the frozen objects
        assert all(not any(obj is k for obj in gc.get_objects(generation=2)) for k in kept[:3])
    finally:
        gc.unfreeze()
