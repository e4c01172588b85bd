"""The daemon's long-lived heap, kept out of the cyclic collector's scans.

A full (generation 2) collection walks every tracked object: with a 64-GPU topology, its
distance tables, the engine's host view and every module loaded, that was 11-17 ms with
the event loop stopped, an API answer's tail. What the daemon holds for its whole life
is built, collected once and frozen (gc.freeze): later collections walk only what
requests create. Done at start and after a hardware change (a new topology), never on a
timer: a frozen cycle is never collected, so garbage must not be frozen."""

from __future__ import annotations

import gc
import time

import structlog

log = structlog.get_logger("topod")


def _return_free_heap() -> None:
    """Start-up (discovery, the engine's warm-up) frees much more than it keeps; glibc holds
    the freed pages in its heap until told to give them back (malloc_trim(3)): ~1 MiB of
    PSS at idle on the h800 host otherwise. Without glibc, nothing to do."""
    try:
        # Imported here, and so possibly while descriptors run out (a flood of clients):
        # then EMFILE, and the heap is simply not trimmed this time.
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: libc's, where it is glibc
    except (OSError, ImportError, AttributeError):
        pass


def freeze_long_lived(reason: str) -> None:
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    _return_free_heap()
    log.debug("heap_frozen", reason=reason, objects=gc.get_freeze_count(),
              seconds=round(time.perf_counter() - started, 4))
