"""The only code that writes /proc/irq: one plan entry at a time, errors classified.

Like irqbalance's activate.c it writes only when the value differs, and every errno gets
a class: EIO/EPERM mean the kernel will never take it (a managed IRQ, or one the chip
cannot move) -> permanent, "managed"; ENOSPC means the CPU has no vector left -> try the
next candidate CPU; EBUSY/EAGAIN/EINVAL/ENOMEM -> transient, retried on later cycles with
backoff. Anything else (EROFS from a read-only /proc/irq in a container or under
ProtectKernelTunables=, EACCES, an errno nobody expected) is permanent too: retrying what
we do not understand only floods the journal. ELOOP, EXDEV, ENXIO and EMLINK are
topod's own refusals, not the kernel's (topod.beneath: a link, a path out of the root,
not a regular file, a hard-linked file): the file is left untouched and the IRQ is
permanent too, since retrying cannot make the tree safe to write. After a write the
effective affinity is read back.
"""

from __future__ import annotations

import errno

from topod.cpulist import format_cpulist
from topod.errors import HostWriteError
from topod.host import HostRoot
from topod.irq.planner import PlanEntry
from topod.irq.procfs import read_affinity
from topod.record import record

MANAGED_ERRNOS = frozenset({errno.EIO, errno.EPERM})  # the kernel will never move this IRQ
NEXT_CPU_ERRNOS = frozenset({errno.ENOSPC})
TRANSIENT_ERRNOS = frozenset({errno.EBUSY, errno.EAGAIN, errno.EINVAL, errno.ENOMEM})
# Answers about the file system, not the IRQ: every later write under /proc/irq fails alike.
TREE_ERRNOS = frozenset({errno.EROFS})
# topod.beneath's answers: the file is not one a write may land in; nothing was written.
REFUSED_HERE_ERRNOS = frozenset({errno.ELOOP, errno.EXDEV, errno.ENXIO, errno.EMLINK})

# Outcome statuses.
MOVED = "moved"  # written, and the effective affinity is inside what was written
PENDING = "pending"  # written; the kernel has not moved it yet (it does at the next interrupt)
PERMANENT = "permanent"
TRANSIENT = "transient"


@record
class WriteOutcome:
    irq: int
    status: str
    written: tuple[int, ...] | None  # what the kernel accepted, None when nothing was
    effective: tuple[int, ...] | None  # read back after the attempt
    errno: int | None = None
    message: str = ""

    @property
    def changed(self) -> bool:
        return self.status in (MOVED, PENDING)

    @property
    def errno_name(self) -> str | None:
        return None if self.errno is None else errno_name(self.errno)

    @property
    def managed(self) -> bool:
        """Permanent because the kernel manages the IRQ (EIO/EPERM), not for another reason."""
        return self.status == PERMANENT and self.errno in MANAGED_ERRNOS

    @property
    def refused_here(self) -> bool:
        """Refused by topod before any byte reached the file (a link, a hard link, not a
        regular file, out of the root), not by the kernel."""
        return self.status == PERMANENT and self.errno in REFUSED_HERE_ERRNOS


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def affinity_path(irq: int) -> str:
    return f"proc/irq/{irq}/smp_affinity_list"


def apply_entry(host: HostRoot, entry: PlanEntry) -> WriteOutcome | None:
    """Carry out one entry; None when there is nothing to write."""
    if not entry.changes or entry.planned is None:
        return None
    targets = [entry.planned] + [(cpu,) for cpu in entry.alternatives]
    refused: list[str] = []
    for target in targets:
        try:
            host.write(affinity_path(entry.irq), format_cpulist(target) + "\n")
        except HostWriteError as exc:
            if exc.errno in NEXT_CPU_ERRNOS:
                refused.append(format_cpulist(target))
                continue
            effective = read_affinity(host, entry.irq).delivered
            if exc.errno in TRANSIENT_ERRNOS:
                return WriteOutcome(entry.irq, TRANSIENT, None, effective, exc.errno,
                                    f"kernel answered {errno_name(exc.errno)} for {format_cpulist(target)}; "
                                    "retried later")
            if exc.errno in REFUSED_HERE_ERRNOS:
                return WriteOutcome(entry.irq, PERMANENT, None, effective, exc.errno,
                                    f"{exc} ({errno_name(exc.errno)}), an answer that is not transient")
            return WriteOutcome(entry.irq, PERMANENT, None, effective, exc.errno,
                                f"kernel refused {format_cpulist(target)}: {errno_name(exc.errno)}")
        effective = read_affinity(host, entry.irq).effective
        status = MOVED if effective is None or set(effective) <= set(target) else PENDING
        note = "" if not refused else f"no vector space on CPU {', '.join(refused)}; "
        if effective is None:
            note += "kernel shows no effective_affinity_list; not confirmed"
        elif status == PENDING:
            note += f"effective affinity still {format_cpulist(effective)}; the kernel moves it at the next interrupt"
        return WriteOutcome(entry.irq, status, target, effective, None, note)
    effective = read_affinity(host, entry.irq).delivered
    return WriteOutcome(entry.irq, TRANSIENT, None, effective, errno.ENOSPC,
                        f"no vector space on any candidate CPU ({', '.join(refused)}); retried later")
