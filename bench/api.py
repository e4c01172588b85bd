"""API round trips over the real socket: 64 concurrent clients each allocate one GPU and
release it, on a 64-GPU synthetic host. Prints p50/p99 latency and throughput."""

from __future__ import annotations

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

CLIENTS = 64
ROUNDS = 20


def main() -> int:
    from topod.hostspec.synthetic import spec_64
    from topod.client import ApiError, Client
    from topod.hostspec import build_host

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = build_host(spec_64(), work / "host")
        (work / "c.toml").write_text('[irq]\nmode = "off"\n[probe]\nenabled = false\n')
        sock = str(work / "s.sock")
        daemon = subprocess.Popen([sys.executable, "-m", "topod.service.main", "--root", str(root), "--socket", sock,
                                   "--state-dir", str(work / "state"), "--config", str(work / "c.toml"),
                                   "--log-format", "json"], stderr=subprocess.DEVNULL,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)))
        try:
            for _ in range(200):
                try:
                    Client(sock).health()
                    break
                except ApiError:
                    time.sleep(0.05)
            latencies: list[float] = []
            failures: list[str] = []
            lock = threading.Lock()

            def worker() -> None:
                client = Client(sock)
                for _ in range(ROUNDS):
                    started = time.perf_counter()
                    try:
                        lease = client.allocate(1, level="any")
                        client.release(lease["id"])
                    except ApiError as exc:
                        with lock:
                            failures.append(exc.code)
                        continue
                    with lock:
                        latencies.append(time.perf_counter() - started)

            threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
            began = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - began
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=15)
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1] if latencies else float("nan")
    print(f"api allocate+release, {CLIENTS} concurrent clients x {ROUNDS}: {len(latencies)} ok, "
          f"{len(failures)} refused {sorted(set(failures))}")
    print(f"api round trip p50 {statistics.median(latencies) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms "
          f"(goal p99 <= 2 ms)")
    print(f"api throughput {2 * len(latencies) / wall:.0f} requests/s (goal >= 2000 on 2 cores; "
          f"client threads share the 2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
