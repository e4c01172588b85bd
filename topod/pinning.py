"""Pinning a job to its lease's CPUs (`topoctl run`, `topoctl bind`, bind_local_rank), and
what it lacks of them.

sched_setaffinity keeps the usable part of a mask without an error: CPUs offline, outside
the caller's cpuset, or absent from this machine (a lease from another host's tree) are
dropped silently. The commands read the mask back and say what was dropped."""

from __future__ import annotations

import os
from collections.abc import Iterable

from topod.cpulist import format_cpulist


def pin_to(cpus: Iterable[int]) -> tuple[set[int], str | None]:
    """Pin the calling process to `cpus` (sched_setaffinity's OSError raised as it is, when
    the kernel can use none of them): (the CPUs the kernel kept, the warning when that is
    fewer than `cpus`)."""
    cpus = list(cpus)  # read twice
    os.sched_setaffinity(0, cpus)
    pinned = os.sched_getaffinity(0)
    return pinned, partial_pinning(cpus, pinned)


def partial_pinning(leased: Iterable[int], pinned: set[int]) -> str | None:
    """The warning for a job pinned to fewer CPUs than it was given; None when it has
    them all (pinned: the mask the kernel kept, sched_getaffinity)."""
    missing = sorted(set(leased) - pinned)
    if not missing:
        return None
    return (f"pinned to CPUs {format_cpulist(sorted(pinned))} only: the lease's CPUs {format_cpulist(missing)} "
            "are not available to this process (offline, outside its cpuset, or not on this machine)")
