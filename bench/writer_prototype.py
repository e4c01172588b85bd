"""The lease API's saturation figure, and the prototype behind topod's writer: is the
commit's wait the wall, or the writer thread that shares the event loop's GIL?

A minimal lease server (not topod: no validation, decision, log or events) answers the
same two requests as `bench/api.py`'s anchor with the same lease JSON, but only once each
change is committed to SQLite (WAL, synchronous=FULL, one group commit at a time, a batch
as a few multi-row statements, as topod writes it). The writers:

- `thread`: a thread woken when the loop's turn ends (topod's writer thread);
- `thread-process`: that thread hands each batch to a forked child and waits for its
  acknowledgement (the GIL is taken twice a batch instead of once a statement);
- `process`: a forked child fed batches through a pipe, also when the turn ends, its
  acknowledgements read by the loop (no GIL shared with the loop);
- `process-eager`: the same child, sent each change at once when it is idle;
- `process-spin`: `process`, with both ends polling a moment before they sleep (the
  child for 2 ms after each batch, the loop for a lone change's acknowledgement);
- `loop`: the loop commits each batch itself when its turn ends (topod's commit of a lone
  change); in `--single`, and under saturation when PROTO_MODES names it (0.74 of bare
  against the thread's 0.62 in three rounds; the same change in topod, ten alternated
  rounds: 0.625 against 0.63, so topod commits in its writer thread alone);
- `loop-fsync`: the loop commits each batch itself when its turn ends with SQLite's own
  sync off (synchronous=OFF: the WAL frames are written, not synced), and a sync thread
  makes them durable with one fdatasync of the WAL file for every batch committed since
  its last one; a change is answered once a sync that began after its commit returns.
  The GIL is taken three times a sync, never between statements; batches pipeline
  (the loop commits the next while the disk syncs the last).

Alternated with the bare aiohttp anchor in the same run, `bench/api.py`'s demo setup
(8 clients, the demo h800 host's lease document): round trips per second and the
ratio to bare, then the PSS of the process writer's server and child.
`--single`: one client's allocate and release p50 on each writer, three rounds.

`python bench/writer_prototype.py [rounds]` (default 3); `python bench/writer_prototype.py --single`.
What this prototype could not show, topod itself did: the writer process built into topod
ran slower there than its writer thread, so topod keeps the thread."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import select
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

MODES = tuple(os.environ.get("PROTO_MODES", "thread,thread-process,process,process-eager,process-spin,loop-fsync")
              .split(","))
SINGLE_MODES = ("loop", "thread", "process", "process-spin", "loop-fsync")
SPIN_SECONDS = 0.002  # process-spin: how long either end polls before it sleeps


# -- the prototype server (run as `writer_prototype.py --serve SOCK MODE LEASE DB`) -------
def open_database(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS leases (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
    return db


def commit(db: sqlite3.Connection, batch: list[tuple[str, object]]) -> None:
    inserts = [params for kind, params in batch if kind == "insert"]
    deletes = [params for kind, params in batch if kind == "delete"]
    db.execute("BEGIN IMMEDIATE")
    if inserts:
        db.execute("INSERT INTO leases VALUES " + ", ".join(["(?, ?)"] * len(inserts)),
                   [value for row in inserts for value in row])
    if deletes:
        db.execute(f"DELETE FROM leases WHERE id IN ({', '.join('?' * len(deletes))})", deletes)
    db.execute("COMMIT")


def read_exactly(fd: int, size: int, spin: bool) -> bytes:
    """`size` bytes (fewer at EOF). spin: the fd is non-blocking and is polled for
    SPIN_SECONDS before waiting in select; else a plain blocking read."""
    data = b""
    deadline = time.monotonic() + SPIN_SECONDS
    while len(data) < size:
        if spin:
            try:
                chunk = os.read(fd, size - len(data))
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    select.select([fd], [], [])
                continue
        else:
            chunk = os.read(fd, size - len(data))
        if not chunk:
            return data
        data += chunk
    return data


def child_writer(batches: int, acks: int, path: str) -> None:
    db = open_database(path)
    spin = os.environ.get("PROTO_SPIN") == "1"
    os.set_blocking(batches, not spin)
    while head := read_exactly(batches, 4, spin):
        (size,) = struct.unpack("I", head)
        sequence, batch = pickle.loads(read_exactly(batches, size, spin))
        commit(db, batch)
        os.write(acks, struct.pack("I", sequence))


class Writer:
    def __init__(self, loop: asyncio.AbstractEventLoop, mode: str, path: str) -> None:
        self.loop, self.mode = loop, mode
        self.pending: list[tuple[tuple[str, object], asyncio.Future]] = []
        self.busy = self.due = False
        self.sequence = 0
        self.in_flight: dict[int, list[asyncio.Future]] = {}
        if mode == "loop":
            self.db = open_database(path)
            return
        if mode == "loop-fsync":
            self.db = open_database(path)
            self.db.execute("PRAGMA synchronous=OFF")
            self.wal_path, self.wal_fd = path + "-wal", None
            self.cond = threading.Condition()
            self.unsynced: list[asyncio.Future] = []
            threading.Thread(target=self.run_sync, daemon=True).start()
            return
        if mode in ("thread", "thread-process"):
            self.cond = threading.Condition()
            self.idle = False
            if mode == "thread":
                self.db = open_database(path)
            else:
                self.remote = self.fork_child(path, blocking=True)
            threading.Thread(target=self.run_thread, daemon=True).start()
            return
        self.batches, self.acks = self.fork_child(path, blocking=False)
        loop.add_reader(self.acks, self.acknowledged)

    def fork_child(self, path: str, blocking: bool) -> tuple[int, int]:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        if os.fork() == 0:
            os.close(from_parent)
            os.close(to_parent)
            child_writer(to_child, from_child, path)
            os._exit(0)
        os.close(to_child)
        os.close(from_child)
        os.set_blocking(to_parent, blocking)
        return from_parent, to_parent

    def queue(self, change: tuple[str, object]) -> asyncio.Future:
        future = self.loop.create_future()
        if self.mode in ("loop", "loop-fsync"):
            self.pending.append((change, future))
            if not self.due:
                self.due = True
                self.loop.call_soon(self.commit_here if self.mode == "loop" else self.commit_unsynced)
            return future
        if self.mode in ("thread", "thread-process"):
            with self.cond:
                self.pending.append((change, future))
                if self.idle and not self.due:
                    self.due = True
                    self.loop.call_soon(self.wake_thread)
            return future
        self.pending.append((change, future))
        if not self.busy:
            if self.mode == "process-eager":
                self.send()
            elif not self.due:  # process, process-spin
                self.due = True
                self.loop.call_soon(self.send)
        return future

    def commit_here(self) -> None:
        self.due = False
        batch, self.pending = self.pending, []
        commit(self.db, [change for change, _ in batch])
        settle([future for _, future in batch])

    def commit_unsynced(self) -> None:
        self.due = False
        batch, self.pending = self.pending, []
        commit(self.db, [change for change, _ in batch])
        if self.wal_fd is None:
            self.wal_fd = os.open(self.wal_path, os.O_RDONLY)
        with self.cond:
            self.unsynced.extend(future for _, future in batch)
            self.cond.notify()

    def run_sync(self) -> None:
        while True:
            with self.cond:
                while not self.unsynced:
                    self.cond.wait()
                synced, self.unsynced = self.unsynced, []
            os.fdatasync(self.wal_fd)
            self.loop.call_soon_threadsafe(settle, synced)

    def wake_thread(self) -> None:
        with self.cond:
            self.due = False
            if self.idle and self.pending:
                self.idle = False
                self.cond.notify()

    def run_thread(self) -> None:
        while True:
            with self.cond:
                while not self.pending:
                    self.idle = True
                    self.cond.wait()
                self.idle = False
                batch, self.pending = self.pending, []
            changes = [change for change, _ in batch]
            if self.mode == "thread":
                commit(self.db, changes)
            else:
                data = pickle.dumps((0, changes))
                os.write(self.remote[0], struct.pack("I", len(data)) + data)
                os.read(self.remote[1], 4)
            self.loop.call_soon_threadsafe(settle, [future for _, future in batch])

    def send(self) -> None:
        self.due = False
        if self.busy or not self.pending:
            return
        batch, self.pending = self.pending, []
        self.sequence += 1
        self.in_flight[self.sequence] = [future for _, future in batch]
        data = pickle.dumps((self.sequence, [change for change, _ in batch]))
        os.write(self.batches, struct.pack("I", len(data)) + data)
        self.busy = True
        if self.mode == "process-spin" and len(batch) == 1:
            deadline = time.monotonic() + SPIN_SECONDS
            while time.monotonic() < deadline:
                try:
                    data = os.read(self.acks, 4)
                except BlockingIOError:
                    continue
                settle(self.in_flight.pop(struct.unpack("I", data)[0]))
                self.busy = False
                return

    def acknowledged(self) -> None:
        data = os.read(self.acks, 4096)
        for start in range(0, len(data), 4):
            (sequence,) = struct.unpack("I", data[start:start + 4])
            settle(self.in_flight.pop(sequence))
        self.busy = False
        if self.pending:
            self.send()


def settle(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class Connection(asyncio.Protocol):
    writer: Writer
    lease: dict

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, separator, body = self.buffer.partition(b"\r\n\r\n")
        if not separator:
            return
        lines = head.split(b"\r\n")
        method, path, _ = lines[0].split(b" ")
        length = sum(int(value) for name, _, value in (line.partition(b":") for line in lines[1:])
                     if name.strip().lower() == b"content-length")
        if len(body) < length:
            return
        if method == b"POST":
            json.loads(body)
            lease_id = uuid.uuid4().hex[:16]
            text = json.dumps(dict(self.lease, id=lease_id))
            future = self.writer.queue(("insert", (lease_id, text)))
            future.add_done_callback(lambda _: self.answer(201, text))
        else:
            lease_id = path.rsplit(b"/", 1)[1].decode()
            future = self.writer.queue(("delete", lease_id))
            answer = json.dumps({"released": lease_id, "gpus": self.lease["gpus"]})
            future.add_done_callback(lambda _: self.answer(200, answer))

    def answer(self, status: int, text: str) -> None:
        body = text.encode()
        self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                             b"Connection: close\r\n\r\n%s" % (status, len(body), body))
        self.transport.close()


async def serve(sock: str, mode: str, lease_path: str, database: str) -> None:
    loop = asyncio.get_running_loop()
    Connection.lease = json.load(open(lease_path))
    Connection.writer = Writer(loop, mode, database)
    await loop.create_unix_server(Connection, sock)
    await asyncio.Event().wait()


# -- the runner ---------------------------------------------------------------------------
def pss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(command: list[str], sock: str, ready) -> tuple[float, list[float]]:  # noqa: ANN001
    import api

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=dict(os.environ, PYTHONPATH=str(BENCH.parent),
                                        PROTO_SPIN="1" if "process-spin" in command else "0"))
    children: list[int] = []
    try:
        ready(sock)
        api.saturate(sock)  # warm
        rate, _, _ = api.saturate(sock)
        children = [int(pid) for pid in open(f"/proc/{process.pid}/task/{process.pid}/children").read().split()]
        memory = [pss_mib(process.pid)] + [pss_mib(pid) for pid in children]
    finally:
        for pid in [process.pid, *children]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
    return rate, memory


def prototype_ready(sock: str) -> None:
    from topod.client import Client

    for _ in range(200):
        try:
            client = Client(sock)
            client.release(client.allocate(1)["id"])
            return
        except Exception:  # noqa: BLE001 - not up yet (refused, or an answer half made)
            time.sleep(0.05)
    raise RuntimeError(f"{sock} did not come up")


def single_rounds() -> int:
    import api

    api.SETUP = api.SETUPS["demo"]
    found: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = api.build_setup_host(work)
        lease = str(work / "lease-proto.json")
        api.bare_command(root, work, "proto")
        for i in range(3):
            for mode in SINGLE_MODES:
                sock = str(work / f"{mode}-{i}.sock")
                command = [sys.executable, __file__, "--serve", sock, mode, lease, str(work / f"{mode}-{i}.db")]
                process = subprocess.Popen(command, env=dict(os.environ, PYTHONPATH=str(BENCH.parent),
                                                             PROTO_SPIN="1" if mode == "process-spin" else "0"))
                try:
                    prototype_ready(sock)
                    _, allocates, releases = api.single(sock)
                finally:
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait()
                found.setdefault(mode, []).append(statistics.median(allocates) * 1000)
                found.setdefault(mode + " release", []).append(statistics.median(releases) * 1000)
    for mode, values in found.items():
        print(mode, " / ".join(f"{v:.3f}" for v in values), "ms p50")
    return 0


def main() -> int:
    import api

    if sys.argv[1:2] == ["--single"]:
        return single_rounds()
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    api.SETUP = api.SETUPS["demo"]
    ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    memory: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = api.build_setup_host(work)
        bare_command, bare_sock = api.bare_command(root, work, "proto")
        lease = str(work / "lease-proto.json")
        for i in range(rounds):
            bare, _ = measure(bare_command, bare_sock, api.wait_ready)
            line = [f"round {i + 1}: bare {bare:.0f} rt/s"]
            for mode in MODES:
                sock = str(work / f"{mode}-{i}.sock")
                command = [sys.executable, __file__, "--serve", sock, mode, lease, str(work / f"{mode}-{i}.db")]
                rate, pss = measure(command, sock, prototype_ready)
                ratios[mode].append(rate / bare)
                if mode == "process":
                    memory = pss
                line.append(f"{mode} {rate:.0f} ({rate / bare:.2f})")
            print("; ".join(line), flush=True)
    load = os.getloadavg()
    print(f"prototype lease server, {api.describe_setup()}, SQLite FULL group commit, {rounds} rounds; load average "
          f"{load[0]:.2f}: " + ", ".join(f"{mode} {statistics.median(values):.2f} of bare"
                                         for mode, values in ratios.items()))
    print(f"PSS of the process writer's server {memory[0]:.1f} MiB and its child {memory[1]:.1f} MiB")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(serve(*sys.argv[2:6]))
    else:
        sys.exit(main())
