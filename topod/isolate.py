"""Live isolation of leased cores in affinity mode (tuna --isolate, done for leases).

While leases hold CPUs, every movable thread of a process outside the leases gets its
affinity narrowed to the CPUs no lease holds (the housekeeping CPUs). Left alone, and
reported: per-CPU kernel threads (the kernel refuses: PF_NO_SETAFFINITY), threads already
pinned inside leased CPUs (a lease's job, pinned by topoctl run or bind), lease owners and
their descendants, topod itself (kept off leased CPUs by `keep_off`, always).

What was changed is recorded in the state directory *before* it is changed (write-ahead:
thread id, its start time, its affinity before, the affinity set), so it is restored when
the last lease ends, on stop, and at the next start after a crash. A thread is given its
old affinity back only if it is the same thread (start time) and still has the affinity
topod set: one changed since by someone else is left as it is, and said.

`plan` is pure; `Isolation` reads /proc through a HostRoot (a fixture's /proc in tests),
acts only on processes its `pids` filter admits (tests: only the children they started),
and calls sched_setaffinity through an injectable setter.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from topod.host import HostRoot

from topod.cpulist import format_cpulist, parse_cpulist
from topod.staterecord import load_record, save_record

PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000
RECORD_NAME = "isolation.json"


@dataclass(frozen=True, slots=True)
class Thread:
    pid: int
    tid: int
    ppid: int
    start: int  # clock ticks after boot (/proc/<pid>/task/<tid>/stat field 22)
    flags: int
    comm: str
    cpus: frozenset[int]


@dataclass(frozen=True, slots=True)
class Change:
    tid: int
    pid: int
    start: int
    before: frozenset[int]
    after: frozenset[int]


@dataclass(slots=True)
class Plan:
    narrow: list[Change] = field(default_factory=list)  # affinity to set now (recorded first)
    adopt: list[Change] = field(default_factory=list)  # inherited narrowing: record only
    restore: list[Change] = field(default_factory=list)  # back to `after` (its before)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> threads


def parse_task_stat(text: str) -> tuple[int, int, int, str] | None:
    """(ppid, flags, start time, comm) from a stat line; None when malformed."""
    open_paren, close_paren = text.find("("), text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        return None
    fields = text[close_paren + 2:].split()
    try:
        return int(fields[1]), int(fields[6]), int(fields[19]), text[open_paren + 1:close_paren]
    except (IndexError, ValueError):
        return None


def parse_allowed(status: str) -> frozenset[int] | None:
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            try:
                return frozenset(parse_cpulist(line.split(":", 1)[1].strip()))
            except ValueError:
                return None
    return None


def plan(threads: Iterable[Thread], leased: frozenset[int], record: dict[int, Change],
         protected: frozenset[int] = frozenset()) -> Plan:
    """What to change so that no thread outside leases may run on `leased` (empty: undo
    everything recorded). record: what topod changed before, by thread id; protected:
    pids never touched (topod, lease owners and their descendants)."""
    result = Plan()
    alive = {}
    by_pid: dict[int, Change] = {}
    for change in record.values():
        by_pid.setdefault(change.pid, change)
    for thread in threads:
        old = record.get(thread.tid)
        if old is not None and old.start == thread.start:
            alive[thread.tid] = thread
            target = old.before - leased
            if not leased or not target or target == old.before:
                if thread.cpus == old.after:
                    result.restore.append(Change(thread.tid, thread.pid, thread.start, old.after, old.before))
                else:
                    result.skipped["changed by someone else since; left as it is"] = \
                        result.skipped.get("changed by someone else since; left as it is", 0) + 1
                    result.restore.append(Change(thread.tid, thread.pid, thread.start, old.after, frozenset()))
            elif target != thread.cpus and thread.cpus == old.after:
                result.narrow.append(Change(thread.tid, thread.pid, thread.start, old.before, target))
            continue
        if not leased:
            continue
        reason = _skip_reason(thread, leased, protected)
        if reason:
            result.skipped[reason] = result.skipped.get(reason, 0) + 1
            continue
        target = thread.cpus - leased
        if target == thread.cpus:
            parent = by_pid.get(thread.pid) or by_pid.get(thread.ppid)
            if parent is not None and thread.cpus == parent.after:
                result.adopt.append(Change(thread.tid, thread.pid, thread.start, parent.before, parent.after))
            continue
        result.narrow.append(Change(thread.tid, thread.pid, thread.start, thread.cpus, target))
    for tid, old in record.items():  # recorded threads that are gone: forget them
        if tid not in alive:
            result.restore.append(Change(tid, old.pid, old.start, old.after, frozenset()))
    return result


def _skip_reason(thread: Thread, leased: frozenset[int], protected: frozenset[int]) -> str | None:
    if thread.pid in protected:
        return "lease owners and topod"
    if thread.flags & PF_NO_SETAFFINITY:
        return "per-CPU kernel threads (the kernel refuses)"
    if not thread.cpus - leased:
        return "pinned inside leased CPUs (a lease's job)"
    return None


class Isolation:
    """The shell: reads threads, keeps the record, sets affinity."""

    def __init__(self, proc: HostRoot, state_dir: str, *, pids: Callable[[int], bool] | None = None,
                 setter: Callable[[int, frozenset[int]], None] = os.sched_setaffinity,
                 own: Callable[[], set[int]] | None = None) -> None:
        self.proc = proc
        self.own = own or (lambda: own_pids(proc))
        self.path = os.path.join(state_dir, RECORD_NAME)
        self.admit = pids or (lambda pid: True)
        self.setter = setter
        self.record: dict[int, Change] = self._load()
        self.last: dict = {"active": False, "threads_narrowed": 0}

    # -- the record -------------------------------------------------------------
    def _load(self) -> dict[int, Change]:
        try:
            body = load_record(self.path)
            if body is None:
                return {}
            return {int(tid): Change(int(tid), int(e["pid"]), int(e["start"]), frozenset(parse_cpulist(e["before"])),
                                     frozenset(parse_cpulist(e["set"]))) for tid, e in body["threads"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            return {}  # unreadable: nothing can be restored from it; said by report()

    def _save(self) -> None:
        threads = {str(c.tid): {"pid": c.pid, "start": c.start, "before": format_cpulist(sorted(c.before)),
                                "set": format_cpulist(sorted(c.after))} for c in self.record.values()}
        save_record(self.path, {"version": 1, "threads": threads} if threads else None)

    # -- reading ------------------------------------------------------------------
    def threads(self, exclude: frozenset[int] = frozenset()) -> list[Thread]:
        found = []
        for name in self.proc.listdir("proc"):
            if not name.isdecimal() or int(name) in exclude or not self.admit(int(name)):
                continue
            pid = int(name)
            for task in self.proc.listdir(f"proc/{pid}/task"):
                stat = self.proc.read(f"proc/{pid}/task/{task}/stat")
                status = self.proc.read(f"proc/{pid}/task/{task}/status")
                parsed = parse_task_stat(stat) if stat else None
                cpus = parse_allowed(status) if status else None
                if parsed is None or cpus is None or not task.isdecimal():
                    continue  # gone meanwhile
                ppid, flags, start, comm = parsed
                found.append(Thread(pid, int(task), ppid, start, flags, comm, cpus))
        return found

    # -- acting ---------------------------------------------------------------------
    def apply(self, leased: Iterable[int], protected: Iterable[int] = ()) -> dict:
        """Narrow (or, leased empty, restore) and return what was done."""
        leased = frozenset(leased)
        guard = frozenset(protected) | frozenset(self.own())
        threads = self.threads()
        tree = descendants(threads, guard)
        result = plan(threads, leased, self.record, tree)
        for change in result.narrow + result.adopt:
            self.record[change.tid] = change if change.tid not in self.record else \
                Change(change.tid, change.pid, change.start, self.record[change.tid].before, change.after)
        if result.narrow or result.adopt:
            self._save()  # write-ahead: what will change is on disk before it changes
        failed = 0
        for change in result.narrow:
            try:
                self.setter(change.tid, change.after)
            except OSError:
                failed += 1
                self.record.pop(change.tid, None)
        restored = 0
        for change in result.restore:
            if change.after:
                try:
                    self.setter(change.tid, change.after)
                    restored += 1
                except OSError:
                    pass
            self.record.pop(change.tid, None)
        if result.restore or failed:
            self._save()
        self.last = {"active": bool(leased), "leased_cpus": format_cpulist(sorted(leased)),
                     "threads_narrowed": len(self.record), "narrowed_now": len(result.narrow) - failed,
                     "restored_now": restored, "failed_now": failed, "left_alone": dict(result.skipped)}
        return self.last

    def restore(self) -> dict:
        return self.apply(())


def own_pids(proc: HostRoot) -> set[int]:
    """This process and its descendants (the IRQ worker), from /proc under `proc`."""
    parents: dict[int, int] = {}
    for name in proc.listdir("proc"):
        if name.isdecimal():
            stat = proc.read(f"proc/{name}/stat")
            parsed = parse_task_stat(stat) if stat else None
            if parsed is not None:
                parents[int(name)] = parsed[0]
    return _tree(parents, {os.getpid()})


def descendants(threads: Iterable[Thread], roots: frozenset[int]) -> frozenset[int]:
    return frozenset(_tree({t.pid: t.ppid for t in threads}, set(roots)))


def _tree(parents: dict[int, int], roots: set[int]) -> set[int]:
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return found


def keep_off(proc: HostRoot, leased: Iterable[int], allowed: frozenset[int],
             setter: Callable[[int, frozenset[int]], None] = os.sched_setaffinity) -> frozenset[int]:
    """Every thread of this process and its children on `allowed` minus the leased CPUs
    (all of `allowed` when every one is leased: nowhere else to go). Returns the set used."""
    target = allowed - frozenset(leased) or allowed
    for pid in own_pids(proc):
        for task in proc.listdir(f"proc/{pid}/task"):
            if task.isdecimal():
                try:
                    setter(int(task), target)
                except OSError:
                    pass  # gone meanwhile
    return target
