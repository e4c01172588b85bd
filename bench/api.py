"""API round trips over the real socket, beside their anchor: a bare aiohttp server on a
Unix socket answering the same two requests (POST /v1/leases, DELETE /v1/leases/{id})
with the lease JSON topod gives for the same request on the same host (captured in the
run), driven by the same client. Then topod (IRQ balancing off) with durability FULL (the
default; group commit) and NORMAL. Two setups (SETUPS): "demo" (the demo
h800 host, 8 concurrent clients, a one-GPU request with topod's defaults: auto cores), and
"64" (64 clients on a 64-GPU synthetic host, level any, no cores). For each: one client
alone on the fresh start (p50/p99), the clients each allocating one GPU and releasing it
(saturation: round trips per second), one client alone again after that, and an open
loop: allocate+release started on a fixed schedule of 300 round trips per second for 10 s
whatever the answers do, each latency counted from its scheduled start (no coordinated
omission).
Under saturation it also reads the CPU each party spent per round trip (/proc: the
server's event-loop thread, its other threads, its child processes; the client's own
times), which a noisy shared machine moves far less than it moves rates.
topod runs once more with IRQ balancing on (dry-run, default interval) for the
saturation figure with the balancer's re-planning in play. Prints the load average too:
a noisy machine shows there. Beside them the physical floor: one small write and its
fsync on the state dir's filesystem, against which each single-client allocate and
release p50 is set (goal: floor + 0.5 ms), and a goals line per topod row
(>= 0.75 of the bare server's rate; the event loop's CPU with and without the
allocation decision's share, read from /metrics; open-loop p99 within 3x the bare
server's). On the 64-GPU setup also GET /v1/topology's body built per reader on the loop
against the one cached per topology version (`python bench/api.py topology`: that alone).
`python bench/api.py [demo|64]`: every row for that setup (both when none is named).
`python bench/api.py saturation N [demo|64]`: only the saturation figure, bare and topod (FULL)
alternated N times, medians of the ratio and of each party's event-loop CPU."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TRIPS = 1280  # round trips per saturation figure, shared among the clients
SINGLE = 300
FRESH = 100  # one client's round trips on a fresh start, before anything else
OPEN_RATE = 300  # round trips per second
OPEN_SECONDS = 10
OPEN_WORKERS = 16

# Each setup: the host, the concurrent clients, what each asks for. "demo" is the demo
# host's row: the 8xH800 demo host, 8 clients, a plain one-GPU request with topod's default
# config (auto cores). "64" is the harder one: 64 clients on a 64-GPU synthetic host.
SETUPS = {
    "demo": {"host": "h800-8gpu", "clients": 8, "request": {}},
    "64": {"host": "64", "clients": 64, "request": {"level": "any", "cpus_per_gpu": 0}},
}
SETUP = SETUPS["64"]

# The anchor answers with the same lease JSON topod gave for the same request on the same
# host (argv[2], captured once), so both put the same bytes on the wire and the client
# parses the same document; aiohttp encodes it per answer as any handler would.
BARE_SERVER = r'''
import json, sys, uuid
from aiohttp import web
LEASE = json.load(open(sys.argv[2]))
async def create(request):
    await request.read()
    return web.json_response(dict(LEASE, id=uuid.uuid4().hex[:16]), status=201)
async def delete(request):
    return web.json_response({"released": request.match_info["id"], "gpus": LEASE["gpus"]})
async def health(request):
    return web.json_response({"status": "ok"})
app = web.Application()
app.add_routes([web.post("/v1/leases", create), web.delete("/v1/leases/{id}", delete), web.get("/v1/health", health)])
web.run_app(app, path=sys.argv[1], print=None, access_log=None)
'''


def wait_ready(sock: str) -> None:
    from topod.client import ApiError, Client

    for _ in range(400):
        try:
            Client(sock).health()
            return
        except (ApiError, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"{sock} did not come up")


def saturate(sock: str) -> tuple[float, list[float], int]:
    from topod.client import ApiError, Client

    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()

    def worker() -> None:
        nonlocal failures
        client = Client(sock)
        for _ in range(TRIPS // SETUP["clients"]):
            started = time.perf_counter()
            try:
                lease = client.allocate(1, **SETUP["request"])
                client.release(lease["id"])
            except ApiError:
                with lock:
                    failures += 1
                continue
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=worker) for _ in range(SETUP["clients"])]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies) / (time.perf_counter() - began), latencies, failures


def single(sock: str, rounds: int = SINGLE) -> tuple[list[float], list[float], list[float]]:
    """One client alone: (round trips, allocates, releases), each in seconds."""
    from topod.client import Client

    client = Client(sock)
    trips, allocates, releases = [], [], []
    for i in range(rounds + 20):
        started = time.perf_counter()
        lease = client.allocate(1, **SETUP["request"])
        granted = time.perf_counter()
        client.release(lease["id"])
        if i >= 20:
            ended = time.perf_counter()
            trips.append(ended - started)
            allocates.append(granted - started)
            releases.append(ended - granted)
    return trips, allocates, releases


def fsync_floor(directory: Path, rounds: int = 200) -> list[float]:
    """The physical floor of a durable grant: one 4 KiB overwrite in a preallocated file
    and its fdatasync on the state dir's filesystem (what SQLite does per FULL commit once
    its WAL has reached its size), in seconds."""
    path = directory / "fsync-floor"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.pwrite(fd, b"\0" * 64 * 4096, 0)
        os.fsync(fd)
        out = []
        for i in range(rounds + 10):
            started = time.perf_counter()
            os.pwrite(fd, b"x" * 4096, (i % 64) * 4096)
            os.fdatasync(fd)
            if i >= 10:
                out.append(time.perf_counter() - started)
        return out
    finally:
        os.close(fd)
        path.unlink()


def sqlite_commits(directory: Path, rounds: int = 200) -> tuple[list[float], list[float]]:
    """One SQLite FULL commit alone (WAL, exclusive locking, as the lease store opens it),
    no thread hand-off, no HTTP: what the database itself adds to the floor, in seconds.
    Twice: into a WAL that grows with each commit (a fresh start's first commits: the
    fdatasync also writes the file's new size), then into the same WAL again after a
    checkpoint (SQLite rewrites it from its start: the daemon's steady state, since its
    writer checkpoints every few hundred commits)."""
    import sqlite3

    db = sqlite3.connect(directory / "commit-floor.sqlite3", isolation_level=None)
    try:
        for pragma in ("locking_mode=EXCLUSIVE", "journal_mode=WAL", "synchronous=FULL", "wal_autocheckpoint=0"):
            db.execute(f"PRAGMA {pragma}")
        db.execute("CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT)")
        runs: list[list[float]] = []
        for run in range(2):
            if run:
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            out = []
            for i in range(rounds + 10):
                started = time.perf_counter()
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO t VALUES (?, ?)", (f"{run}{i:016x}", "x" * 1400))
                db.execute("COMMIT")
                if i >= 10:
                    out.append(time.perf_counter() - started)
            runs.append(out)
        return runs[0], runs[1]
    finally:
        db.close()


def decision_seconds(sock: str) -> tuple[float, int]:
    """(sum, count) of topod's allocation decisions so far, from /metrics."""
    import socket as _socket

    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(sock)
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    found = {}
    for line in data.decode().splitlines():
        for key in ("topod_allocation_decision_seconds_sum", "topod_allocation_decision_seconds_count"):
            if line.startswith(key + " "):
                found[key] = float(line.split()[1])
    return found.get("topod_allocation_decision_seconds_sum", 0.0), int(found.get(
        "topod_allocation_decision_seconds_count", 0))


def open_loop(sock: str) -> tuple[list[float], int]:
    """Round trips started on a fixed schedule; latency from the scheduled start, so a
    stall delays (and counts against) every round trip due during it. Also the
    allocations refused (a stall long enough that every GPU is leased by round trips
    still in flight): counted, and that worker takes its next slot."""
    from topod.client import ApiError, Client

    total = OPEN_RATE * OPEN_SECONDS
    start = time.perf_counter() + 0.2
    latencies: list[float] = []
    refused = 0
    next_slot = iter(range(total))
    lock = threading.Lock()

    def worker() -> None:
        nonlocal refused
        client = Client(sock)
        while True:
            with lock:
                slot = next(next_slot, None)
            if slot is None:
                return
            due = start + slot / OPEN_RATE
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                lease = client.allocate(1, **SETUP["request"])
            except ApiError:
                with lock:
                    refused += 1
                continue
            client.release(lease["id"])
            finished = time.perf_counter()
            with lock:
                latencies.append(finished - due)

    threads = [threading.Thread(target=worker) for _ in range(OPEN_WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, refused


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def process_cpu(pid: int) -> float:
    """CPU seconds so far of a process (all its threads) or, as /proc/PID/task/TID, one thread."""
    return _stat_cpu(f"/proc/{pid}/stat")


def _stat_cpu(stat_path: str) -> float:
    with open(stat_path) as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (the IRQ worker)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: ask every process its parent
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
        return found


def server_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's event-loop thread (its main thread), its other
    threads, and its child processes (the IRQ worker), from /proc."""
    cpu = {"loop": 0.0, "threads": 0.0, "children": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            cpu["loop" if int(tid) == pid else "threads"] += _stat_cpu(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # a thread that ended meanwhile
            pass
    for child in child_pids(pid):
        try:
            cpu["children"] += process_cpu(child)
        except OSError:
            pass
    return cpu


def client_cpu() -> float:
    used = os.times()
    return used.user + used.system


def measure(command: list[str], sock: str, commits=None, decisions: bool = False) -> dict:
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        wait_ready(sock)
        # One client first, on the fresh start every node has after a boot or an upgrade (and
        # for days after it, at a few leases an hour: the WAL is then young), then again
        # after the saturation run's thousands of commits.
        _, fresh_allocates, fresh_releases = single(sock, FRESH)
        # CPU per round trip under saturation: steadier than rates on a shared VM, where the
        # client, the event loop and the server's threads share the same two cores.
        decided_before = decision_seconds(sock) if decisions else (0.0, 0)
        before, client_before = server_cpu(process.pid), client_cpu()
        rate, latencies, failures = saturate(sock)
        after, client_after = server_cpu(process.pid), client_cpu()
        decided_after = decision_seconds(sock) if decisions else (0.0, 0)
        trips = max(1, len(latencies))
        cpu_us = {key: (after[key] - before[key]) / trips * 1e6 for key in after}
        cpu_us["client"] = (client_after - client_before) / trips * 1e6
        decision_us = (decided_after[0] - decided_before[0]) / trips * 1e6
        alone, allocates, releases = single(sock)
        scheduled, refused_open = open_loop(sock)
        extra = commits(sock) if commits else ""
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    return {"rate": rate, "cpu_us": cpu_us, "p50_64": statistics.median(latencies), "p99_64": p99(latencies),
            "failures": failures, "decision_us": decision_us,
            "p50_1": statistics.median(alone), "p99_1": p99(alone), "extra": extra,
            "alloc_p50": statistics.median(allocates), "alloc_p99": p99(allocates),
            "release_p50": statistics.median(releases), "release_p99": p99(releases),
            "fresh_alloc_p50": statistics.median(fresh_allocates), "fresh_release_p50": statistics.median(fresh_releases),
            "p50_open": statistics.median(scheduled), "p99_open": p99(scheduled), "refused_open": refused_open}


def topod_commits(sock: str) -> str:
    from topod.client import Client

    commits = Client(sock).health().get("commits", {})
    if not commits.get("transactions"):
        return ""
    return f"; {commits['changes']} changes in {commits['transactions']} commits " \
           f"({commits['changes'] / commits['transactions']:.2f} per fsync)"


def topology_figures(root: Path, reads: int = 30) -> str:
    """GET /v1/topology's body on the 64-GPU host: built per reader on the event loop
    against the body cached per topology version (built once, off the
    loop; each read splices the leased GPUs). Median event-loop time per read."""
    import asyncio

    from topod.api.answers import dumps
    from topod.discover import discover
    from topod.distance import DistanceModel
    from topod.host import HostRoot
    from topod.service.topology_body import TopologyBody
    from topod.topojson import topology_to_json

    topology = discover(HostRoot(root), live_nvml=False)
    version = (topology, DistanceModel(topology), {})

    def per_reader() -> bytes:
        doc = topology_to_json(version[0], version[1])
        doc["cluster"], doc["leased_gpus"] = {}, [0, 1]
        return dumps(doc).encode()

    before = []
    for _ in range(reads):
        start = time.perf_counter()
        per_reader()
        before.append(time.perf_counter() - start)
    cache = TopologyBody(lambda: version)

    async def cached() -> list[float]:
        await cache.body([0, 1])  # the one build of this version, in a thread
        times = []
        for _ in range(reads):
            start = time.perf_counter()
            await cache.body([0, 1])
            times.append(time.perf_counter() - start)
        return times

    after = asyncio.run(cached())
    b, a = statistics.median(before), statistics.median(after)
    return (f"GET /v1/topology body, 64 GPUs, event-loop time per read: built per reader {b * 1e3:.2f} ms, "
            f"cached per version {a * 1e6:.1f} us ({b / a:.0f}x less), {len(per_reader())} bytes")


def build_setup_host(work: Path) -> Path:
    from topod.hostspec import build_host, load_builtin_spec
    from topod.hostspec.synthetic import spec_64

    host = SETUP["host"]
    return build_host(spec_64() if host == "64" else load_builtin_spec(host), work / f"host-{host}")


def topod_command(root: Path, work: Path, label: str, config: str) -> tuple[list[str], str]:
    """topod as a user starts it (its defaults, plus the bench's config file), and its socket."""
    (work / f"{label}.toml").write_text(config)
    sock = str(work / f"{label}.sock")
    return ([sys.executable, "-m", "topod.service.main", "--root", str(root), "--socket", sock,
             "--state-dir", str(work / f"state-{label}"), "--config", str(work / f"{label}.toml"),
             "--log-format", "json"], sock)


def bare_command(root: Path, work: Path, label: str) -> tuple[list[str], str]:
    """The anchor, answering with the lease document topod gives for this setup's request
    on this host (taken from a topod started for it alone)."""
    from topod.client import Client

    (work / "bare.py").write_text(BARE_SERVER)
    document = work / f"lease-{label}.json"
    if not document.exists():
        command, sock = topod_command(root, work, f"capture-{label}", '[irq]\nmode = "off"\n[probe]\nenabled = false\n')
        process = subprocess.Popen(command, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   env=dict(os.environ, PYTHONPATH=str(REPO)))
        try:
            wait_ready(sock)
            client = Client(sock)
            lease = client.allocate(1, **SETUP["request"])
            client.release(lease["id"])
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        document.write_text(json.dumps(lease))
    sock = str(work / f"bare-{label}.sock")
    return [sys.executable, str(work / "bare.py"), sock, str(document)], sock


def saturation_rounds(rounds: int) -> int:
    """Bare server and topod (FULL, IRQ off) alternated `rounds` times, saturation only:
    medians of the rate ratio and of each party's event-loop CPU per round trip."""
    ratios, loops, bare_loops, decisions = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = build_setup_host(work)
        for i in range(rounds):
            figures = []
            for kind in ("bare", "topod"):
                command, sock = (bare_command(root, work, "sat") if kind == "bare" else
                                 topod_command(root, work, f"sat{i}", '[irq]\nmode = "off"\n[probe]\nenabled = false\n'))
                figures.append(measure_saturation(command, sock, decisions=kind == "topod"))
            bare, topod = figures
            ratios.append(topod["rate"] / bare["rate"])
            loops.append(topod["loop"])
            bare_loops.append(bare["loop"])
            decisions.append(topod["decision_us"])
            print(f"round {i + 1}: bare {bare['rate']:.0f} rt/s (loop {bare['loop']:.0f} us), topod {topod['rate']:.0f} "
                  f"rt/s (loop {topod['loop']:.0f} us, decision {topod['decision_us']:.0f} us, writer "
                  f"{topod['threads']:.0f} us): {ratios[-1]:.2f} of bare", flush=True)
    load = os.getloadavg()
    median = statistics.median
    print(f"saturation, {describe_setup()}, {rounds} rounds alternated; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}: topod {median(ratios):.2f} of bare (min {min(ratios):.2f}, max {max(ratios):.2f}); "
          f"event loop per round trip: topod {median(loops):.0f} us ({median(loops) - median(decisions):.0f} us "
          f"without the decision), bare {median(bare_loops):.0f} us")
    return 0


def describe_setup() -> str:
    request = ", ".join(f"{key}={value}" for key, value in SETUP["request"].items()) or "defaults"
    host = "64-GPU synthetic host" if SETUP["host"] == "64" else f"{SETUP['host']} host"
    return f"{SETUP['clients']} clients, {host}, 1 GPU with {request}"


def measure_saturation(command: list[str], sock: str, decisions: bool = False) -> dict:
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        wait_ready(sock)
        decided_before = decision_seconds(sock) if decisions else (0.0, 0)
        before = server_cpu(process.pid)
        rate, latencies, _ = saturate(sock)
        after = server_cpu(process.pid)
        decided_after = decision_seconds(sock) if decisions else (0.0, 0)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    trips = max(1, len(latencies))
    return {"rate": rate, "loop": (after["loop"] - before["loop"]) / trips * 1e6,
            "threads": (after["threads"] - before["threads"]) / trips * 1e6,
            "decision_us": (decided_after[0] - decided_before[0]) / trips * 1e6}


def main() -> int:
    """`api.py [demo|64]`: every row for that setup (both when none is named);
    `api.py saturation N [demo|64]`; `api.py topology`."""
    global SETUP
    args = sys.argv[1:]
    if args[:1] == ["topology"]:
        from topod.hostspec import build_host
        from topod.hostspec.synthetic import spec_64

        with tempfile.TemporaryDirectory() as tmp:
            print(topology_figures(build_host(spec_64(), Path(tmp) / "host")))
        return 0
    if args[:1] == ["saturation"]:
        SETUP = SETUPS[args[2] if len(args) > 2 else "demo"]
        return saturation_rounds(int(args[1]) if len(args) > 1 else 3)
    for name in args or list(SETUPS):
        SETUP = SETUPS[name]
        all_rows()
    return 0


def all_rows() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = build_setup_host(work)
        command, sock = bare_command(root, work, "rows")
        rows.append(("bare aiohttp, same lease JSON", measure(command, sock)))
        for durability, irq in (("full", "off"), ("normal", "off"), ("full", "dry-run")):
            label = f"{durability}-{irq}"
            command, sock = topod_command(root, work, label, f'[daemon]\nsqlite_synchronous = "{durability}"\n'
                                                              f'[irq]\nmode = "{irq}"\n[probe]\nenabled = false\n')
            name = f"topod, sqlite {durability.upper()}" + (", IRQ dry-run" if irq != "off" else "")
            rows.append((name, measure(command, sock, topod_commits, decisions=True)))
        floor = fsync_floor(work)
        growing, reused = sqlite_commits(work)
        topology_line = topology_figures(root) if SETUP["host"] == "64" else None
    load = os.getloadavg()
    if topology_line:
        print(topology_line)
    print(f"api allocate+release round trips; {describe_setup()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    floor_p50 = statistics.median(floor)
    print(f"fsync floor on the state dir's filesystem (4 KiB overwrite + fdatasync): p50 {floor_p50 * 1e3:.2f} ms, "
          f"p99 {p99(floor) * 1e3:.2f} ms; one SQLite FULL commit alone: into a reused WAL (steady state) p50 "
          f"{statistics.median(reused) * 1e3:.2f} ms, p99 {p99(reused) * 1e3:.2f} ms; into a growing WAL (a "
          f"start's first commits) p50 {statistics.median(growing) * 1e3:.2f} ms, p99 {p99(growing) * 1e3:.2f} ms")
    bare = rows[0][1]
    for name, row in rows:
        print(f"{name:<34} {SETUP['clients']} clients: {row['rate']:7.0f} rt/s ({row['rate'] / bare['rate']:.2f} of bare), "
              f"p50 {row['p50_64'] * 1e3:6.2f} ms, p99 {row['p99_64'] * 1e3:6.2f} ms, {row['failures']} refused | "
              f"1 client: p50 {row['p50_1'] * 1e3:5.2f} ms, p99 {row['p99_1'] * 1e3:5.2f} ms | "
              f"open loop {OPEN_RATE} rt/s: p50 {row['p50_open'] * 1e3:5.2f} ms, p99 {row['p99_open'] * 1e3:5.2f} ms, "
              f"{row['refused_open']} refused"
              f"{row['extra']}")
        cpu = row["cpu_us"]
        print(f"{'':<34} CPU per round trip at saturation: event loop {cpu['loop']:.0f} us, other threads "
              f"{cpu['threads']:.0f} us, child processes {cpu['children']:.0f} us, client {cpu['client']:.0f} us "
              f"(total {sum(cpu.values()):.0f} us, {sum(cpu.values()) / sum(bare['cpu_us'].values()):.2f} of bare)")
        if row is bare:
            continue
        decision = row["decision_us"]
        print(f"{'':<34} goals: {row['rate'] / bare['rate']:.2f} of bare (>= 0.75); event loop {cpu['loop']:.0f} us, "
              f"{cpu['loop'] - decision:.0f} us without the decision's {decision:.0f} us (bare {bare['cpu_us']['loop']:.0f} "
              f"us) | 1 client: allocate p50 {row['alloc_p50'] * 1e3:.2f} ms (p99 {row['alloc_p99'] * 1e3:.2f}), "
              f"release p50 {row['release_p50'] * 1e3:.2f} ms (p99 {row['release_p99'] * 1e3:.2f}); on the fresh start "
              f"({FRESH} round trips) {row['fresh_alloc_p50'] * 1e3:.2f} / {row['fresh_release_p50'] * 1e3:.2f} ms "
              f"(bare {bare['fresh_alloc_p50'] * 1e3:.2f} / {bare['fresh_release_p50'] * 1e3:.2f}); floor + 0.5 = "
              f"{(floor_p50 + 0.0005) * 1e3:.2f} ms | open loop p99 {row['p99_open'] / bare['p99_open']:.1f}x bare's "
              f"(<= 3x)")


if __name__ == "__main__":
    sys.exit(main())
