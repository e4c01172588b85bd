"""What a periodic rescan keeps from the pass before: facts fixed for the life of the
kernel object they describe, read again only when that object's stamp changes.

- CPUs (core, package, siblings, last-level cache) change only with the present and
  online masks (hot-plug, SMT control) or with node membership: one key over those.
- A PCI function's identity (vendor, device, class) and its maximum link are fixed while
  its sysfs directory lives: keyed by the directory's path, device, inode and ctime (a
  function removed and added again is a new directory). Its numa_node (root may write
  it), current link, driver, MSI vectors and child devices are read on every pass.
- A function's local CPUs are the kernel's CPU mask of its node (cpumask_of_node, read
  when the file is read): kept with the directory's stamp, the numa_node just read and
  the CPU key above, so a node rewritten or a CPU going on or offline reads them again.

A read that left a warning or a read problem is never kept: the next pass reads again
and reports again. Only the daemon's rescan loop keeps a memo; `topoctl` and the API's
first answer read everything."""

from __future__ import annotations

import os
from collections.abc import Callable

from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.record import field, record

TYPE_CHECKING = False  # typing costs ~3 ms of every topoctl start; annotations are never evaluated
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")


@record
class PciIdentity:
    vendor: int | None
    device: int | None
    class_code: int | None
    max_speed: str | None
    max_width: int | None


@record(frozen=False)
class DiscoveryMemo:
    cpus: tuple[Any, Any] | None = None  # (key, cpus)
    pci: dict[tuple, tuple[None, PciIdentity]] = field(default_factory=dict)  # stamp -> (None, identity)
    local_cpus: dict[tuple, tuple[Any, tuple[int, ...] | None]] = field(default_factory=dict)  # stamp -> (key, cpus)
    hits: int = 0
    misses: int = 0
    root: str | None = None
    _seen: set[tuple] = field(default_factory=set)

    def begin_pass(self, root: str) -> None:
        if root != self.root:  # another host tree: nothing known carries over
            self.cpus, self.pci, self.local_cpus, self.root = None, {}, {}, root
        self._seen = set()

    def end_pass(self) -> None:
        """Forget functions this pass did not see (removed ones): the memo never outgrows the host."""
        for table in (self.pci, self.local_cpus):
            for stamp in [s for s in table if s not in self._seen]:
                del table[stamp]

    @property
    def cpu_key(self) -> Any:
        """The key of the CPUs this pass found (None before they are read)."""
        return self.cpus[0] if self.cpus is not None else None

    def cpus_for(self, key: Any, host: HostRoot, notes: Notes, read: Callable[[], T]) -> T:
        if self.cpus is not None and self.cpus[0] == key:
            self.hits += 1
            return self.cpus[1]
        self.misses += 1
        value, clean = _clean_read(host, notes, read)
        self.cpus = (key, value) if clean else None
        return value

    def pci_identity(self, stamp: tuple | None, host: HostRoot, notes: Notes,
                     read: Callable[[], PciIdentity]) -> PciIdentity:
        return self._by_stamp(self.pci, stamp, None, host, notes, read)

    def local_cpus_for(self, stamp: tuple | None, numa_node: int | None, host: HostRoot, notes: Notes,
                       read: Callable[[], list[int] | None]) -> list[int] | None:
        key = (numa_node, self.cpu_key)
        kept = self._by_stamp(self.local_cpus, stamp if key[1] is not None else None, key, host, notes,
                              lambda: _frozen(read()))
        return list(kept) if kept is not None else None  # the caller's own list

    def _by_stamp(self, table: dict[tuple, tuple[Any, T]], stamp: tuple | None, key: Any, host: HostRoot,
                  notes: Notes, read: Callable[[], T]) -> T:
        """table[stamp] = (key, value): the value read again when the stamp or the key is
        new, and kept only when the read was clean."""
        if stamp is None:
            return read()
        self._seen.add(stamp)
        known = table.get(stamp)
        if known is not None and known[0] == key:
            self.hits += 1
            return known[1]
        self.misses += 1
        value, clean = _clean_read(host, notes, read)
        if clean:
            table[stamp] = (key, value)
        else:
            table.pop(stamp, None)
        return value


def _frozen(cpus: list[int] | None) -> tuple[int, ...] | None:
    return tuple(cpus) if cpus is not None else None


def directory_stamp(path: str, fd: int) -> tuple | None:
    """(path, device, inode, ctime) of an open directory; None when it cannot be told."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (path, st.st_dev, st.st_ino, st.st_ctime_ns)


def _clean_read(host: HostRoot, notes: Notes, read: Callable[[], T]) -> tuple[T, bool]:
    before = len(notes.items)
    with host.collecting_problems() as problems:
        value = read()
    return value, not problems and len(notes.items) == before
