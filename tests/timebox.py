"""Fail a test instead of hanging the suite when a block blocks (a FIFO opened for reading,
a read that never ends): SIGALRM raises TimeoutError inside the block."""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def within(seconds: float):
    def expire(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
