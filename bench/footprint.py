"""Footprint: the idle daemon as a user starts it (its own defaults, only
--root/--socket/--state-dir, on the demo h800-8gpu host) and the whole-process
`topoctl topo --json` against the interpreter's floor.

- memory: PSS (/proc/PID/smaps_rollup) of the daemon and its IRQ worker, and their sum
  (goal <= 40 MiB together), on a second start (the first fills the bytecode cache);
- idle CPU: both processes' CPU time (the scheduler's, in ns) over IDLE_SECONDS after
  start-up settled, as a share of one core (goal <= 0.1 %), and each process's part;
- `topoctl topo --json` on every real tree of tests/data/hosts, bytecode cached (as an
  install runs it), run as the installed console script where there is one, interleaved
  with `python -I -c 'import json'`: medians and their ratio (goal <= 1.5x on every tree),
  and beside them the least any such command could do there (LEAST_POSSIBLE).
One line per figure, with the load average.

    python bench/footprint.py [--idle-seconds 30] [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from api import child_pids, process_cpu, wait_ready  # noqa: E402  (bench/api.py)

CORPUS = REPO / "tests" / "data" / "hosts"


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def cpu_seconds(pid: int) -> float:
    """CPU time of all of a process's threads, from the scheduler's nanosecond count
    (/proc/PID/task/TID/schedstat): utime/stime come in 10 ms ticks, 0.033 % of a core
    over 30 s, too coarse for a 0.1 % goal."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def start_daemon(root: Path, work: Path, name: str, env: dict) -> subprocess.Popen:
    sock = str(work / f"{name}.sock")
    daemon = subprocess.Popen([*topod_command(), "--root", str(root), "--socket", sock,
                               "--state-dir", str(work / f"state-{name}")], stderr=subprocess.DEVNULL, env=env)
    wait_ready(sock)
    return daemon


def idle_daemon(root: Path, work: Path, idle_seconds: float, env: dict) -> None:
    # A first start compiles every module into the fresh bytecode cache (the standard
    # library's too, under PYTHONPYCACHEPREFIX): an installed daemon starts from compiled
    # bytecode, and the compiler's transient heap is not the daemon's footprint.
    warm = start_daemon(root, work, "warm-up", env)
    warm.send_signal(signal.SIGTERM)
    warm.wait(timeout=30)
    daemon = start_daemon(root, work, "idle", env)
    try:
        time.sleep(8.0)  # start-up work (discovery, first IRQ cycle, probe) is not idle
        pids = {"daemon": daemon.pid}
        for pid in child_pids(daemon.pid):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            pids["IRQ worker" if b"irq_worker" in command else f"child {pid}"] = pid
        before = {name: (cpu_seconds(pid), process_cpu(pid)) for name, pid in pids.items()}
        started = time.monotonic()
        time.sleep(idle_seconds)
        elapsed = time.monotonic() - started
        shares = {name: (cpu_seconds(pid) - before[name][0]) / elapsed for name, pid in pids.items()}
        ticks = {name: (process_cpu(pid) - before[name][1]) / elapsed for name, pid in pids.items()}
        memory = {name: pss_mib(pid) for name, pid in pids.items()}
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    parts = ", ".join(f"{name} {mib:.1f}" for name, mib in memory.items())
    print(f"memory PSS: daemon + IRQ worker {sum(memory.values()):.1f} MiB ({parts}) (goal <= 40 MiB); {load()}")
    parts = ", ".join(f"{name} {share:.3%}" for name, share in shares.items())
    print(f"idle CPU over {elapsed:.0f} s: {sum(shares.values()):.3%} of a core ({parts}; in 10 ms ticks "
          f"{sum(ticks.values()):.3%}) (goal <= 0.1 %); {load()}")


def real_trees(work: Path) -> list[tuple[str, Path]]:
    trees = []
    for archive in sorted(CORPUS.glob("*.tar.bz2")):
        name = archive.name.removesuffix(".tar.bz2")
        target = work / "trees" / name
        target.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="fully_trusted")
        entries = list(target.iterdir())
        trees.append((name, entries[0] if len(entries) == 1 and entries[0].is_dir() else target))
    return trees


def timed(command: list[str], env: dict, cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def console_command(script: str, module: str) -> list[str]:
    """An installed console script (beside this interpreter, as users and systemd's
    ExecStart run it); `python -m module` where there is none, which also loads runpy:
    ~3 ms more for topoctl; no difference measured in the daemon's PSS (31.8-32.2 MiB
    either way)."""
    path = Path(sys.executable).parent / script
    return [str(path)] if path.is_file() else [sys.executable, "-m", module]


def topod_command() -> list[str]:
    return console_command("topod", "topod.service.main")


def topoctl_command() -> list[str]:
    return console_command("topoctl", "topod.cli.topoctl")


# The least any `topoctl topo --json` could do on a tree: the listings and reads discovery
# makes there (recorded from discovery itself), each read with the checks topod's host
# root makes (stat first: never open a FIFO or a device; open non-blocking; fstat: the
# same file; one read), no parsing, one JSON document out. Its ratio to the floor is what
# is left of a goal for imports, parsing, the model and the output together.
LEAST_POSSIBLE = """
import json, os, stat, sys
root, plan = sys.argv[1], json.load(open(sys.argv[2]))
flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
out = {}
for rel in plan["dirs"]:
    try:
        out[rel] = sorted(os.listdir(f"{root}/{rel}"))
    except OSError:
        pass
for rel in plan["files"]:
    try:
        before = os.stat(f"{root}/{rel}")
    except OSError:
        continue
    if not stat.S_ISREG(before.st_mode):
        continue
    fd = os.open(f"{root}/{rel}", flags)
    try:
        if os.fstat(fd).st_ino == before.st_ino:
            out[rel] = os.read(fd, 65536).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
sys.stdout.write(json.dumps(out) + "\\n")
"""


def discovery_plan(root: Path, target: Path) -> Path:
    """The files and directories discovery reads on `root`, in its order, as JSON."""
    from topod import host as host_module
    from topod.discover import discover

    files, dirs = [], []
    load, listdir = host_module.HostRoot._load, host_module.HostRoot.listdir

    def recording_load(self, rel, limit, dir_fd=None, name="", listed_regular=False):  # noqa: ANN001, ANN202
        files.append(rel)
        return load(self, rel, limit, dir_fd, name, listed_regular)

    def recording_listdir(self, rel):  # noqa: ANN001, ANN202
        dirs.append(rel.lstrip("/"))
        return listdir(self, rel)

    host_module.HostRoot._load, host_module.HostRoot.listdir = recording_load, recording_listdir
    try:
        discover(host_module.HostRoot(str(root)))
    finally:
        host_module.HostRoot._load, host_module.HostRoot.listdir = load, listdir
    target.write_text(json.dumps({"files": files, "dirs": dirs}))
    return target


def topo_vs_floor(work: Path, runs: int, env: dict) -> None:
    floor_cmd = [sys.executable, "-I", "-c", "import json"]
    (work / "least.py").write_text(LEAST_POSSIBLE)
    worst = worst_least = 0.0
    print(f"topoctl is {' '.join(topoctl_command())}")
    for name, root in real_trees(work):
        topo_cmd = [*topoctl_command(), "topo", "--root", str(root), "--json"]
        least_cmd = [sys.executable, "-I", str(work / "least.py"), str(root),
                     str(discovery_plan(root, work / f"plan-{name}.json"))]
        for command in (topo_cmd, floor_cmd, least_cmd):  # compile and cache bytecode, warm the page cache
            timed(command, env, work)
        topo, floor, least = [], [], []
        for _ in range(runs):  # interleaved: the machine's drift hits all alike
            topo.append(timed(topo_cmd, env, work))
            floor.append(timed(floor_cmd, env, work))
            least.append(timed(least_cmd, env, work))
        ratio = statistics.median(topo) / statistics.median(floor)
        least_ratio = statistics.median(least) / statistics.median(floor)
        worst, worst_least = max(worst, ratio), max(worst_least, least_ratio)
        print(f"topoctl topo --json {name}: {statistics.median(topo) * 1e3:.1f} ms, python -I -c 'import json' "
              f"{statistics.median(floor) * 1e3:.1f} ms: {ratio:.2f}x; the least possible (same reads and checks, "
              f"no parsing) {statistics.median(least) * 1e3:.1f} ms: {least_ratio:.2f}x; {load()}")
    print(f"topoctl topo --json, worst ratio to the floor: {worst:.2f}x (goal <= 1.5x); the least possible's worst "
          f"{worst_least:.2f}x; {load()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--skip-topo", action="store_true")
    parser.add_argument("--skip-daemon", action="store_true")
    args = parser.parse_args()
    from topod.hostspec import build_host, load_builtin_spec

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # bytecode cached outside the tree, as on an installed system, even where
        # PYTHONDONTWRITEBYTECODE is set (else every start compiles every module)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPYCACHEPREFIX=str(work / "pycache"), PYTHONPATH=str(REPO),
                   TOPOD_SOCKET=str(work / "no-daemon.sock"))
        if not args.skip_daemon:
            idle_daemon(build_host(load_builtin_spec("h800-8gpu"), work / "seed"), work, args.idle_seconds, env)
        if not args.skip_topo:
            topo_vs_floor(work, args.runs, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
