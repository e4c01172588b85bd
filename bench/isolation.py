"""Isolation's P99 effect, on CPUs: a rank's busy-step loop on a leased CPU with CPU hogs
outside the lease, isolation off vs on, and `topoctl bind` vs an unpinned rank.

    python bench/isolation.py [--seconds 6] [--hogs 3] [--whole-host]

Each row runs a step loop (a fixed amount of work, ~0.7 ms on an idle CPU) for --seconds and
prints step p50/p99/max in ms, the steps done, and the 1-minute load average at its end:
  idle          bound rank (topoctl bind), no hogs: the floor
  unpinned      rank started plainly, hogs free to run anywhere
  bound         rank through topoctl bind (pinned to the leased CPU), hogs anywhere
  bound+isolate bound rank, hogs narrowed off the leased CPU by topod.isolate
The leased CPU is the highest this process may use; the lease is modelled by the
environment topoctl bind reads (TOPOD_GPU_CPUS). By default topod.isolate acts only on the
hogs this benchmark started (its pid filter), never on other processes of the host. With
--whole-host (root) it does what `[isolate] system = true` does on an affinity-mode host:
every movable thread of every process but the rank and this benchmark leaves the leased
CPU for the row, and is given its affinity back after it (the record in a temporary state
directory; per-CPU kernel threads stay, as the kernel wants). The row then counts what
isolation does against the whole host's load, not only against the hogs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEP_TARGET_S = 0.0007


def work(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def step_loop(seconds: float, iterations: int) -> None:
    """The rank: steps until `seconds` pass; prints its step times as JSON."""
    steps = []
    end = time.perf_counter() + seconds
    clock = time.perf_counter
    while True:
        started = clock()
        if started >= end:
            break
        work(iterations)
        steps.append(clock() - started)
    steps.sort()
    n = len(steps)
    print(json.dumps({"steps": n, "p50": steps[n // 2], "p99": steps[min(n - 1, int(n * 0.99))], "max": steps[-1],
                      "cpus": sorted(os.sched_getaffinity(0))}))


def calibrate(cpu: int) -> int:
    """Iterations for one ~0.7 ms step on `cpu`, idle."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        iterations = 20000
        best = min(_timed(iterations) for _ in range(20))
        return max(1000, int(iterations * STEP_TARGET_S / best))
    finally:
        os.sched_setaffinity(0, before)


def _timed(iterations: int) -> float:
    started = time.perf_counter()
    work(iterations)
    return time.perf_counter() - started


def rank(seconds: float, iterations: int, bind: bool, env: dict[str, str]) -> dict:
    step = [sys.executable, str(Path(__file__).resolve()), "--step", str(seconds), "--iterations", str(iterations)]
    command = [sys.executable, "-m", "topod.cli.topoctl", "bind", "--", *step] if bind else step
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=seconds + 60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(report: dict) -> str:
    """An Isolation report (apply or restore), one line: threads moved, given back,
    failed, and those left alone by reason."""
    alone = "; ".join(f"{reason}: {count}" for reason, count in sorted(report.get("left_alone", {}).items()))
    return (f"narrowed {report.get('narrowed_now', 0)}, restored {report.get('restored_now', 0)}, "
            f"failed {report.get('failed_now', 0)}" + (f", left alone ({alone})" if alone else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--hogs", type=int, default=3)
    parser.add_argument("--whole-host", action="store_true",
                        help="isolate every movable process of the host for the isolation row, not only the hogs (root)")
    parser.add_argument("--step", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step is not None:
        step_loop(args.step, args.iterations)
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("bench/isolation.py: needs two CPUs (one leased, one for everything else)")
        return 2
    from topod.enforce import host_enforcement
    from topod.host import HostRoot
    from topod.isolate import Isolation

    leased = cpus[-1]
    iterations = calibrate(leased)
    env = dict(os.environ, PYTHONPATH=str(REPO), LOCAL_RANK="0", TOPOD_GPU_CPUS=f"0:{leased}", TOPOD_GPU_NODES="0:",
               CUDA_VISIBLE_DEVICES="0", TOPOD_GPUS="0")
    enforcement = host_enforcement(HostRoot("/"))
    print(f"host: {len(cpus)} CPUs, leased CPU {leased}, housekeeping {cpus[:-1]}, enforcement {enforcement.mode} "
          f"({enforcement.reason}); step {iterations} iterations (~{STEP_TARGET_S * 1e3:.1f} ms idle), "
          f"{args.seconds:g} s a row, {args.hogs} hogs")
    print(f"{'row':<15}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'steps':>8}{'load1':>7}  rank CPUs")
    rows: dict[str, dict] = {}

    def show(name: str, result: dict) -> None:
        rows[name] = result
        print(f"{name:<15}{result['p50'] * 1e3:8.2f}{result['p99'] * 1e3:8.2f}{result['max'] * 1e3:8.2f}"
              f"{result['steps']:8d}{os.getloadavg()[0]:7.2f}  {result['cpus']}", flush=True)

    show("idle", rank(args.seconds, iterations, True, env))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        time.sleep(0.5)
        show("unpinned", rank(args.seconds, iterations, False, env))
        show("bound", rank(args.seconds, iterations, True, env))
        with tempfile.TemporaryDirectory() as state:
            pids = {hog.pid for hog in hogs}
            admit = None if args.whole_host else pids.__contains__
            # own: nothing; this benchmark's descendants (the hogs) must move, and the bound
            # rank is left alone by isolate itself (its threads sit inside the leased CPUs).
            isolation = Isolation(HostRoot("/"), state, pids=admit, own=set)
            applied = isolation.apply({leased})
            try:
                show("bound+isolate", rank(args.seconds, iterations, True, env))
            finally:
                restored = isolation.restore()
            print(f"isolation ({'whole host' if args.whole_host else 'hogs only'}): {_summary(applied)}; "
                  f"restored: {_summary(restored)}")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    base = rows["bound"]
    iso = rows["bound+isolate"]
    print(f"isolation: p99 {base['p99'] * 1e3:.2f} -> {iso['p99'] * 1e3:.2f} ms "
          f"({base['p99'] / iso['p99']:.1f}x), steps {base['steps']} -> {iso['steps']} "
          f"({iso['steps'] / max(1, base['steps']):.2f}x)")
    print(f"bind vs unpinned (hogs free): p99 {rows['unpinned']['p99'] * 1e3:.2f} vs {base['p99'] * 1e3:.2f} ms, "
          f"steps {rows['unpinned']['steps']} vs {base['steps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
