"""Live isolation of leased cores (affinity mode): the plan, and for real on processes
this test starts (and only those: every Isolation here admits only its own children)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from topod.host import HostRoot
from topod.isolate import PF_KTHREAD, PF_NO_SETAFFINITY, RECORD_NAME, Change, Isolation, Thread, plan

REPO = Path(__file__).resolve().parents[2]
CPUS = frozenset(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
ALL = frozenset({0, 1, 2, 3})


def _t(tid: int, cpus=ALL, pid: int | None = None, flags: int = 0, ppid: int = 1, start: int = 100) -> Thread:
    return Thread(pid if pid is not None else tid, tid, ppid, start, flags, f"t{tid}", frozenset(cpus))


# -- the plan (pure) ---------------------------------------------------------------------
def test_movable_threads_outside_leases_are_narrowed_to_housekeeping_cpus():
    result = plan([_t(10), _t(11, {1, 2})], frozenset({2, 3}), {})
    assert {(c.tid, c.after) for c in result.narrow} == {(10, frozenset({0, 1})), (11, frozenset({1}))}
    assert result.narrow[0].before == ALL


def test_per_cpu_kthreads_lease_jobs_and_protected_pids_are_left_alone_and_counted():
    threads = [_t(2, {3}, flags=PF_KTHREAD | PF_NO_SETAFFINITY), _t(20, {2, 3}), _t(30), _t(31, pid=30),
               _t(40, flags=PF_KTHREAD)]
    result = plan(threads, frozenset({2, 3}), {}, protected=frozenset({30}))
    assert [c.tid for c in result.narrow] == [40], "a movable kernel thread is moved"
    assert result.skipped == {"per-CPU kernel threads (the kernel refuses)": 1,
                              "pinned inside leased CPUs (a lease's job)": 1, "lease owners and topod": 2}


def test_no_leases_restores_what_was_recorded_and_nothing_else():
    record = {10: Change(10, 10, 100, ALL, frozenset({0, 1}))}
    result = plan([_t(10, {0, 1}), _t(11, {0, 1})], frozenset(), record)
    assert [(c.tid, c.after) for c in result.restore] == [(10, ALL)]
    assert not result.narrow


def test_a_thread_changed_by_someone_else_is_not_restored():
    record = {10: Change(10, 10, 100, ALL, frozenset({0, 1}))}
    result = plan([_t(10, {0})], frozenset(), record)
    assert [(c.tid, c.after) for c in result.restore] == [(10, frozenset())], "forgotten, not set"
    assert "changed by someone else since; left as it is" in result.skipped


def test_a_recycled_thread_id_is_not_given_the_old_threads_affinity():
    record = {10: Change(10, 10, 100, ALL, frozenset({0, 1}))}
    result = plan([_t(10, {0, 1}, start=999)], frozenset(), record)
    assert [c.after for c in result.restore] == [frozenset()]


def test_children_born_narrowed_are_adopted_with_their_parents_old_affinity():
    record = {10: Change(10, 10, 100, ALL, frozenset({0, 1}))}
    result = plan([_t(10, {0, 1}), _t(12, {0, 1}, ppid=10)], frozenset({2, 3}), record)
    assert [(c.tid, c.before) for c in result.adopt] == [(12, ALL)]


def test_a_new_lease_narrows_again_from_the_original_affinity():
    record = {10: Change(10, 10, 100, ALL, frozenset({0, 1}))}
    result = plan([_t(10, {0, 1})], frozenset({1, 2, 3}), record)
    assert [(c.tid, c.before, c.after) for c in result.narrow] == [(10, ALL, frozenset({0}))]


# -- for real, on children this test starts ---------------------------------------------------
def _children(n: int = 2) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(n)]


def _stop(children) -> None:
    for child in children:
        child.kill()
        child.wait()


def _affinity(pid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(pid))


@needs_two
def test_children_outside_leases_move_off_leased_cpus_and_come_back(tmp_path):
    children = _children()
    try:
        kids = {c.pid for c in children}
        leased = max(CPUS)
        isolation = Isolation(HostRoot("/"), str(tmp_path), pids=kids.__contains__, own=set)
        done = isolation.apply({leased})
        assert done["narrowed_now"] >= 2
        for pid in kids:
            assert _affinity(pid) == CPUS - {leased}
        record = json.loads((tmp_path / RECORD_NAME).read_text())
        assert {e["pid"] for e in record["threads"].values()} == kids
        assert isolation.restore()["restored_now"] >= 2
        for pid in kids:
            assert _affinity(pid) == CPUS
        assert not (tmp_path / RECORD_NAME).exists()
    finally:
        _stop(children)


@needs_two
def test_a_thread_moved_by_someone_else_meanwhile_keeps_their_choice(tmp_path):
    children = _children(1)
    try:
        pid = children[0].pid
        isolation = Isolation(HostRoot("/"), str(tmp_path), pids=lambda p: p == pid, own=set)
        isolation.apply({max(CPUS)})
        os.sched_setaffinity(pid, {max(CPUS)})  # the test's own child: someone else's choice
        result = isolation.restore()
        assert _affinity(pid) == {max(CPUS)}
        assert "changed by someone else since; left as it is" in result["left_alone"]
    finally:
        _stop(children)


HELPER = """
import os, sys, time
from topod.host import HostRoot
from topod.isolate import Isolation
kids = {int(p) for p in sys.argv[2].split(",")}
Isolation(HostRoot("/"), sys.argv[1], pids=kids.__contains__, own=set).apply({int(sys.argv[3])})
print("applied", flush=True)
time.sleep(120)
"""


@needs_two
def test_kill_9_of_the_isolating_process_is_restored_at_the_next_start(tmp_path):
    children = _children()
    kids = {c.pid for c in children}
    leased = max(CPUS)
    try:
        helper = subprocess.Popen([sys.executable, "-c", HELPER, str(tmp_path), ",".join(map(str, kids)),
                                   str(leased)], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert helper.stdout.readline().strip() == "applied"
        helper.send_signal(signal.SIGKILL)
        helper.wait()
        for pid in kids:
            assert _affinity(pid) == CPUS - {leased}, "a crash leaves the narrowing in place..."
        assert (tmp_path / RECORD_NAME).exists(), "...and its record on disk"
        reborn = Isolation(HostRoot("/"), str(tmp_path), pids=kids.__contains__, own=set)
        reborn.restore()  # what the daemon does at start
        for pid in kids:
            assert _affinity(pid) == CPUS
        assert not (tmp_path / RECORD_NAME).exists()
    finally:
        _stop(children)


@needs_two
def test_topod_keeps_itself_and_its_children_off_leased_cpus(tmp_path):
    script = """
import os, subprocess, sys, threading, time
from topod.host import HostRoot
from topod.isolate import keep_off
worker = threading.Thread(target=time.sleep, args=(30,), daemon=True); worker.start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
time.sleep(0.5)
allowed = frozenset(os.sched_getaffinity(0))
used = keep_off(HostRoot("/"), {max(allowed)}, allowed)
tasks = [frozenset(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]
print(sorted(used), all(t == used for t in tasks), frozenset(os.sched_getaffinity(child.pid)) == used)
used = keep_off(HostRoot("/"), set(), allowed)
print(sorted(used), frozenset(os.sched_getaffinity(worker.native_id)) == allowed)
child.kill()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == f"{sorted(CPUS - {max(CPUS)})} True True"
    assert second == f"{sorted(CPUS)} True", "with no lease, topod runs on all its CPUs again"
