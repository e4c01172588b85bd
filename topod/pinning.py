"""What a job pinned by `topoctl run` or `topoctl bind` lacks of its lease's CPUs.

sched_setaffinity keeps the usable part of a mask without an error: CPUs offline, outside
the caller's cpuset, or absent from this machine (a lease from another host's tree) are
dropped silently. The commands read the mask back and say what was dropped."""

from __future__ import annotations

from collections.abc import Iterable

from topod.cpulist import format_cpulist


def partial_pinning(leased: Iterable[int], pinned: set[int]) -> str | None:
    """The warning for a job pinned to fewer CPUs than it was given; None when it has
    them all (pinned: the mask the kernel kept, sched_getaffinity)."""
    missing = sorted(set(leased) - pinned)
    if not missing:
        return None
    return (f"pinned to CPUs {format_cpulist(sorted(pinned))} only: the lease's CPUs {format_cpulist(missing)} "
            "are not available to this process (offline, outside its cpuset, or not on this machine)")
