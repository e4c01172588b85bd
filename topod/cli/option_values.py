"""topoctl's option values: the `type=` of each option that takes a duration, a count,
GPU names or CPUs per GPU. A bad value is a usage error (status 2) that says what was
expected; argparse's own float would take inf, nan and 1e300 seconds, which a later call
(time.sleep, a socket timeout) refuses with a traceback.

Its own module so that `topoctl topo`, whose options take none of these, does not
import it: the options in topod.cli.commands that do import it when their parser is made.
"""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from exc
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


MAX_SECONDS = 1e8  # ~3 years; timers overflow the platform's time_t far above it (1e300 does)


def seconds(text: str) -> float:
    """A duration: a finite number from 0 to MAX_SECONDS (argparse's float takes 'inf',
    'nan' and 1e300, which time.sleep and socket timeouts refuse with a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_SECONDS:.0f} seconds, got {text!r}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: no limit), got {value}")
    return value


def gpu_names(text: str) -> list[int | str]:
    """'0,3' or '0000:17:00.0,GPU-8f1...': indices as numbers, addresses and UUIDs as given
    (the daemon checks that each names one of its GPUs)."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU indices, PCI addresses or UUIDs, got {text!r}")
    return [int(name) if name.isdecimal() else name for name in names]


def cpus_per_gpu(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of CPUs or 'auto', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def lease_id(text: str) -> str:
    """A lease id as the daemon writes them (hex digits, `topoctl leases` lists them);
    anything else (`../health`, `ab?x=1`, blanks) is a usage error, never sent."""
    from topod.client import LEASE_ID_MAX, is_lease_id

    if not is_lease_id(text.lower()):
        raise argparse.ArgumentTypeError(
            f"not a lease id: {text!r} (a lease id is hex digits, at most {LEASE_ID_MAX}, "
            "e.g. 9436932d016188cc: see topoctl leases)")
    return text.lower()


def event_name(text: str) -> str:
    """One of the daemon's event names (topod.event_kinds): a misspelt name would filter
    out every event and wait for ever."""
    from topod.event_kinds import EVENT_KINDS

    if text not in EVENT_KINDS:
        raise argparse.ArgumentTypeError(f"unknown event {text!r}; topod's events: {', '.join(EVENT_KINDS)}")
    return text
