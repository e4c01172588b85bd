"""What a second HTTP stack for grants and releases buys a user: topod started as users
start it (its defaults, the demo host tree, --socket and --state-dir in a temporary
directory) with the lean grant/release path (httptools framing beside aiohttp) and with
aiohttp alone, from the same code. Each run starts both side by side and measures them in
turn, request by request or round by round, so that a noisy machine's load falls on both
alike:

- one client alone, allocate (one GPU, the default request) then release, each over a
  fresh connection as topoctl and curl make them: p50 and p99 of each;
- `topoctl allocate --gpus 1` as a user types it, whole-process wall time: p50;
- 8 jobs starting at once: 8 processes released by one barrier each allocate one GPU,
  every round's grants released before the next; p99 over all grants and the median of
  each round's slowest;
- beside them, not a figure a user meets: 8 clients allocating and releasing back to
  back (saturation), round trips per second.

Each figure is the median over the runs (fresh daemons each) of that run's value, the two
stacks side by side with their ratio (aiohttp alone / lean: above 1 the lean path is
faster).

topod serves with aiohttp alone: the lean path (topod/api/leanhttp.py) bought too little
to keep a second stack. Without --rev the bench runs the working tree when it has that
module, else the last revision that had it (exported with `git archive`); "aiohttp alone"
is that same tree started with the module made unimportable, which is how it served
without httptools.

`python bench/http_stack.py [--runs N] [--rev REV]`
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LEAN_MODULE = "topod/api/leanhttp.py"
HOST = "h800-8gpu"
SINGLE = 300  # one client's allocate+release round trips per run
WARM_UP = 20
TOPOCTL = 15  # topoctl allocate invocations per run
JOBS = 8
BURSTS = 30  # rounds of 8 jobs starting at once, per run
SATURATION = 480  # round trips per saturation block, shared by the JOBS clients; 2 blocks per stack and run
GRANT = json.dumps({"gpus": 1}).encode()
STACKS = ("lean", "aiohttp")

# topod's own entry point (topod.service.main:main, as the `topod` script calls it); for
# "aiohttp" the lean module is unimportable first, as on an install without httptools.
LAUNCH = ("import sys\n"
          "if sys.argv.pop(1) == 'aiohttp':\n"
          "    sys.modules['topod.api.leanhttp'] = None\n"
          "from topod.service.main import main\n"
          "sys.argv[0] = 'topod'\n"
          "sys.exit(main())\n")


# -- a minimal client: one request per connection, as topoctl and curl -----------------------
def exchange(path: str, request: bytes) -> tuple[int, bytes, bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


def allocate_request(body: bytes = GRANT) -> bytes:
    return (b"POST /v1/leases HTTP/1.1\r\nHost: topod\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body


def release_request(lease_id: str) -> bytes:
    return f"DELETE /v1/leases/{lease_id} HTTP/1.1\r\nHost: topod\r\nConnection: close\r\n\r\n".encode()


def allocate(path: str) -> tuple[str, bytes]:
    status, head, body = exchange(path, allocate_request())
    if status != 201:
        raise RuntimeError(f"allocate answered {status}: {body[:300]!r}")
    return json.loads(body)["id"], head


def release(path: str, lease_id: str) -> None:
    status, _, body = exchange(path, release_request(lease_id))
    if status != 200:
        raise RuntimeError(f"release answered {status}: {body[:300]!r}")


# -- the daemon ---------------------------------------------------------------------------
class Daemon:
    """topod from `source` with its defaults and only --root, --socket, --state-dir."""

    def __init__(self, source: Path, root: Path, work: Path, stack: str) -> None:
        self.source, self.work, self.stack = source, work, stack
        work.mkdir(parents=True)
        self.socket = str(work / "topod.sock")
        self.env = bench_env(source)
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, stack, "--root", str(root), "--socket", self.socket,
             "--state-dir", str(work / "state")],
            cwd=work, env=self.env, stdout=subprocess.DEVNULL, stderr=open(work / "daemon.log", "wb"))

    def wait_ready(self, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"topod exited {self.process.returncode}: "
                                   f"{(self.work / 'daemon.log').read_text()[-2000:]}")
            try:
                if exchange(self.socket, b"GET /v1/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")[0]:
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("topod did not come up")

    def check_stack(self) -> None:
        """The lean path answers without aiohttp's Server header: each run is the stack named."""
        lease_id, head = allocate(self.socket)
        release(self.socket, lease_id)
        lean = b"\r\nserver:" not in head.lower()
        if lean != (self.stack == "lean"):
            raise RuntimeError(f"asked for {self.stack}, the grant was answered by the other stack"
                               + (" (the lean path needs httptools installed)" if self.stack == "lean" else ""))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def bench_env(source: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(source))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # time start-up as an install runs it
    env.pop("NOTIFY_SOCKET", None)
    return env


# -- the figures ----------------------------------------------------------------------------
def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def single_client(daemons: dict[str, Daemon]) -> dict[str, tuple[list[float], list[float]]]:
    """One client alone, allocate then release, on each stack in turn, round trip by round
    trip (the order swapped every round): the machine's noise falls on both alike."""
    out: dict[str, tuple[list[float], list[float]]] = {stack: ([], []) for stack in daemons}
    for i in range(WARM_UP + SINGLE):
        for stack in _order(daemons, i):
            path = daemons[stack].socket
            started = time.perf_counter()
            lease_id, _ = allocate(path)
            granted = time.perf_counter()
            release(path, lease_id)
            if i >= WARM_UP:
                out[stack][0].append(granted - started)
                out[stack][1].append(time.perf_counter() - granted)
    return out


def _order(daemons: dict[str, Daemon], i: int) -> list[str]:
    stacks = list(daemons)
    return stacks if i % 2 == 0 else stacks[::-1]


def topoctl_allocate(daemons: dict[str, Daemon]) -> dict[str, list[float]]:
    walls: dict[str, list[float]] = {stack: [] for stack in daemons}
    for i in range(TOPOCTL + 2):
        for stack in _order(daemons, i):
            daemon = daemons[stack]
            command = [sys.executable, "-m", "topod.cli.topoctl", "--socket", daemon.socket, "--json",
                       "allocate", "--gpus", "1"]
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, env=daemon.env, cwd=daemon.work)
            wall = time.perf_counter() - started
            if done.returncode != 0:
                raise RuntimeError(f"topoctl allocate exited {done.returncode}: {done.stderr.decode()[-500:]}")
            release(daemon.socket, json.loads(done.stdout)["id"])
            if i >= 2:  # the first compile their bytecode
                walls[stack].append(wall)
    return walls


def _job(paths: list[str], barrier, results) -> None:
    """One of the jobs: at each round's barrier, allocate one GPU from the daemon the
    round names; report its latency."""
    while True:
        if barrier.wait() is None:
            return
        path = paths[barrier.target.value]
        started = time.perf_counter()
        try:
            lease_id, _ = allocate(path)
            results.put((time.perf_counter() - started, lease_id))
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator
            results.put((None, repr(exc)))


class _Barrier:
    """A multiprocessing barrier with the round's daemon and a stop word: wait() gives None
    once stopped."""

    def __init__(self, parties: int) -> None:
        self.barrier = multiprocessing.Barrier(parties)
        self.running = multiprocessing.Value("b", 1)
        self.target = multiprocessing.Value("i", 0)

    def wait(self):
        self.barrier.wait()
        return True if self.running.value else None


def at_once(daemons: dict[str, Daemon]) -> dict[str, tuple[list[float], list[float]]]:
    """Per stack (every grant's latency, each round's slowest) over BURSTS rounds of JOBS
    jobs at once, the stacks' rounds alternated."""
    stacks = list(daemons)
    paths = [daemons[stack].socket for stack in stacks]
    barrier = _Barrier(JOBS + 1)
    results = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=_job, args=(paths, barrier, results)) for _ in range(JOBS)]
    for worker in workers:
        worker.start()
    out: dict[str, tuple[list[float], list[float]]] = {stack: ([], []) for stack in stacks}
    try:
        for i in range(BURSTS + 2):
            for stack in _order(daemons, i):
                barrier.target.value = stacks.index(stack)
                barrier.wait()
                round_ = [results.get(timeout=60) for _ in range(JOBS)]
                failed = [what for latency, what in round_ if latency is None]
                if failed:
                    raise RuntimeError(f"a job's allocate failed: {failed[0]}")
                for _, lease_id in round_:
                    release(daemons[stack].socket, lease_id)
                time.sleep(0.02)  # the releases' aftermath (IRQ re-plan) out of the next round
                if i >= 2:  # the first rounds warm each stack's first connections up
                    times = [latency for latency, _ in round_]
                    out[stack][0].extend(times)
                    out[stack][1].append(max(times))
    finally:
        barrier.running.value = 0
        barrier.wait()
        for worker in workers:
            worker.join(timeout=10)
    return out


def saturation(daemons: dict[str, Daemon]) -> dict[str, list[float]]:
    """Not a user's figure, shown beside them: JOBS clients (threads) each allocating and
    releasing back to back, round trips per second, the stacks' blocks alternated."""
    rates: dict[str, list[float]] = {stack: [] for stack in daemons}

    def client(path: str, trips: int) -> None:
        for _ in range(trips):
            release(path, allocate(path)[0])

    for i in range(2):
        for stack in _order(daemons, i):
            threads = [threading.Thread(target=client, args=(daemons[stack].socket, SATURATION // JOBS))
                       for _ in range(JOBS)]
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rates[stack].append(SATURATION // JOBS * JOBS / (time.perf_counter() - began))
    return rates


def one_run(source: Path, root: Path, work: Path) -> dict[str, dict[str, float]]:
    """Both stacks started side by side, each figure measured on them in turn."""
    daemons = {stack: Daemon(source, root, work / stack, stack) for stack in STACKS}
    try:
        for daemon in daemons.values():
            daemon.wait_ready()
            daemon.check_stack()
        single = single_client(daemons)
        burst = at_once(daemons)
        walls = topoctl_allocate(daemons)
        rates = saturation(daemons)
    finally:
        for daemon in daemons.values():
            daemon.stop()
    figures = {}
    for stack in STACKS:
        allocates, releases = single[stack]
        grants, slowest = burst[stack]
        figures[stack] = {
            "allocate_p50": statistics.median(allocates), "allocate_p99": p99(allocates),
            "release_p50": statistics.median(releases), "release_p99": p99(releases),
            "burst_p99": p99(grants), "burst_max_median": statistics.median(slowest),
            "topoctl_p50": statistics.median(walls[stack]),
            "saturation": statistics.median(rates[stack]),
        }
    return figures


FIGURES = [
    ("allocate_p50", "one client, allocate p50"),
    ("allocate_p99", "one client, allocate p99"),
    ("release_p50", "one client, release p50"),
    ("release_p99", "one client, release p99"),
    ("burst_p99", f"{JOBS} jobs allocating at once, p99 over {BURSTS} rounds"),
    ("burst_max_median", f"{JOBS} jobs allocating at once, median of each round's slowest"),
    ("topoctl_p50", "`topoctl allocate --gpus 1`, whole process, p50"),
    ("saturation", f"saturation (not a user's figure): {JOBS} clients allocating and releasing back to back, "
                   "round trips per second"),
]
DECIDING = ("allocate_p50", "allocate_p99", "burst_p99")


# -- the source tree -------------------------------------------------------------------------
def source_tree(rev: str | None, tmp: Path) -> tuple[Path, str]:
    """The tree to run (path, description): the working tree while it has the lean module,
    else `rev` or the last revision that had it, exported."""
    if rev is None and (REPO / LEAN_MODULE).exists():
        return REPO, "the working tree"
    if rev is None:
        removed = _git("log", "-1", "--format=%H", "--diff-filter=D", "--", LEAN_MODULE).strip()
        if not removed:
            raise SystemExit(f"no revision removed {LEAN_MODULE}; name one with --rev")
        rev = f"{removed}^"
    commit = _git("rev-parse", "--short", rev).strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "topod"],
                             capture_output=True, check=True).stdout
    target = tmp / f"src-{commit}"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    if not (target / LEAN_MODULE).exists():
        raise SystemExit(f"{commit} has no {LEAN_MODULE}")
    return target, f"revision {commit}"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs, each with both stacks fresh (default 5)")
    parser.add_argument("--rev", help="git revision whose topod to run (default: see above)")
    args = parser.parse_args()
    from topod.hostspec import build_host, load_builtin_spec

    with tempfile.TemporaryDirectory(prefix="topod-http-stack-") as tmp_name:
        tmp = Path(tmp_name)
        source, described = source_tree(args.rev, tmp)
        root = build_host(load_builtin_spec(HOST), tmp / "host")
        print(f"# topod from {described}, {HOST} host, defaults; {args.runs} runs, the two stacks "
              f"measured in turn; "
              f"load average {os.getloadavg()[0]:.2f} at start")
        runs: dict[str, list[dict[str, float]]] = {stack: [] for stack in STACKS}
        for index in range(args.runs):
            for stack, figures in one_run(source, root, tmp / f"run-{index}").items():
                runs[stack].append(figures)
        print(f"# load average {os.getloadavg()[0]:.2f} at the end")
        for key, label in FIGURES:
            if key == "saturation":
                lean = statistics.median(run[key] for run in runs["lean"])
                alone = statistics.median(run[key] for run in runs["aiohttp"])
                each = {stack: " / ".join(f"{run[key]:.0f}" for run in runs[stack]) for stack in STACKS}
                print(f"{label}: aiohttp alone {alone:.0f}/s, lean {lean:.0f}/s, lean {lean / alone:.2f}x the rate "
                      f"(runs: aiohttp {each['aiohttp']}; lean {each['lean']})")
                continue
            lean = statistics.median(run[key] for run in runs["lean"])
            alone = statistics.median(run[key] for run in runs["aiohttp"])
            each = {stack: " / ".join(f"{run[key] * 1e3:.2f}" for run in runs[stack]) for stack in STACKS}
            print(f"{label}: aiohttp alone {alone * 1e3:.2f} ms, lean {lean * 1e3:.2f} ms, ratio {alone / lean:.2f}x "
                  f"(runs: aiohttp {each['aiohttp']}; lean {each['lean']})")
        ratios = {key: statistics.median(run[key] for run in runs["aiohttp"])
                  / statistics.median(run[key] for run in runs["lean"]) for key in DECIDING}
        keep = "lean beside aiohttp" if min(ratios.values()) >= 2.0 else "aiohttp alone"
        print(f"verdict (the lean path stays only at >= 2x on allocate p50, p99 and the {JOBS}-job p99): {keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
