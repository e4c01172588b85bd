"""What the kernel refused, and for how long topod leaves it alone (no I/O).

Three kinds of failure survive between cycles:
- an IRQ the kernel will never move (EIO/EPERM: kernel-managed) or refused with an errno
  topod does not know to be transient (EXDEV, 999, ...): marked per IRQ, announced once,
  never written again while the IRQ keeps its number and name;
- a transient answer (EBUSY/EAGAIN/EINVAL/ENOMEM, or ENOSPC on every candidate CPU):
  retried on a later cycle, with exponential backoff;
- /proc/irq itself not writable (EROFS: a read-only mount in a container or under
  systemd's ProtectKernelTunables=; or every write of a cycle failing with one permanent
  errno, such as EACCES for a daemon that is not root): announced once as
  `irq_writes_impossible`, after which the balancer writes nothing but one probe per
  full cycle, until the probe succeeds or the settings or mode change.
"""

from __future__ import annotations

import errno

from topod.irq.apply import MANAGED_ERRNOS, errno_name
from topod.record import field, record


@record(frozen=False)
class Unsettable:
    name: str | None
    errno: int

    @property
    def managed(self) -> bool:
        return self.errno in MANAGED_ERRNOS


@record(frozen=False)
class Retry:
    name: str | None
    attempts: int
    next_at: float
    errno: int | None


@record
class Blocked:
    """/proc/irq refuses every write."""

    errno: int
    reason: str  # for a person: "/proc/irq is read-only (EROFS)"
    since: float  # wall clock
    mode: str  # the mode it was found in; another mode tries writing again
    # For a verdict inferred from every write failing alike (not EROFS): the IRQs that
    # failed, by name. Should a later write succeed, the fault was theirs after all.
    refused: dict[int, str | None] = field(default_factory=dict)


def blocked_reason(code: int) -> str:
    if code == errno.EROFS:
        return "/proc/irq read-only (EROFS)"
    if code == errno.EACCES:
        return "/proc/irq not writable by topod (EACCES; not root, or refused by a security module)"
    return f"every write under /proc/irq failed ({errno_name(code)})"


def blocked_hint(code: int) -> str:
    if code == errno.EROFS:
        return ("the file system is mounted read-only (a container's /proc, or systemd "
                "ProtectKernelTunables=yes); give topod a writable /proc/irq or set irq.mode = \"dry-run\"")
    if code == errno.EACCES:
        return "run topod as root (with CAP_SYS_ADMIN), or set irq.mode = \"dry-run\""
    return "no IRQ can be moved until this changes; set irq.mode = \"dry-run\" to only plan"


class Failures:
    """The failure state one IrqBalancer keeps. Mutated only by the balancer's cycles."""

    def __init__(self) -> None:
        self.unsettable: dict[int, Unsettable] = {}
        self.retries: dict[int, Retry] = {}
        self.blocked: Blocked | None = None
        self.unwritten: set[int] = set()  # IRQs with a planned change /proc/irq would not take
        self.last_error: str | None = None
        self.last_probe = -1  # while blocked: the IRQ the last probe write went to

    def block(self, code: int, wall: float, mode: str, refused: dict[int, str | None] | None = None) -> Blocked:
        self.blocked = Blocked(code, blocked_reason(code), wall, mode, dict(refused or {}))
        self.last_probe = -1
        self.last_error = f"{self.blocked.reason}: {blocked_hint(code)}"
        return self.blocked

    def unblock(self) -> None:
        self.blocked = None
        self.last_probe = -1
        self.unwritten.clear()

    def forget(self, gone: list[int]) -> None:
        for irq in gone:
            self.unsettable.pop(irq, None)
            self.retries.pop(irq, None)
            self.unwritten.discard(irq)

    @property
    def count(self) -> int:
        """IRQs topod wants to move and cannot: marked ones plus those a read-only tree holds."""
        return len(self.unsettable) + len(self.unwritten)

    def to_json(self) -> dict[str, object]:
        by_errno: dict[str, int] = {}
        for mark in self.unsettable.values():
            by_errno[errno_name(mark.errno)] = by_errno.get(errno_name(mark.errno), 0) + 1
        if self.blocked is not None and self.unwritten:
            name = errno_name(self.blocked.errno)
            by_errno[name] = by_errno.get(name, 0) + len(self.unwritten)
        return {
            "permanent": self.count,
            "managed": sum(1 for mark in self.unsettable.values() if mark.managed),
            "by_errno": dict(sorted(by_errno.items())),
            "retrying": len(self.retries),
            "writable": self.blocked is None,
            "reason": None if self.blocked is None else self.blocked.reason,
            "hint": None if self.blocked is None else blocked_hint(self.blocked.errno),
            "since": None if self.blocked is None else self.blocked.since,
            "last_error": self.last_error,
        }
