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


def test_descriptors_run_out_while_freezing_the_heap_is_not_trimmed_and_nothing_raises(monkeypatch):
    """Under a flood of clients the first freeze may import ctypes with no descriptor left
    (EMFILE): that freeze still happens, the heap is just not trimmed, and nothing raises
    into the daemon (which once exited on it: the CI's descriptor-exhaustion test)."""
    import builtins
    import sys

    real_import = builtins.__import__

    def no_descriptors(name, *args, **kwargs):
        if name == "ctypes":
            raise OSError(24, "Too many open files")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "ctypes", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_descriptors)
    before = gc.get_freeze_count()
    try:
        freeze_long_lived("test")
        assert gc.get_freeze_count() >= before
    finally:
        gc.unfreeze()
