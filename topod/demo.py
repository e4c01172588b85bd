"""`make demo`: the daemon on the embedded demo host (the seed's 8x H800 server).

Builds the demo host tree in a temporary directory, starts `topod` on a socket there
(no root needed), runs a few topoctl commands against it as a user would, and stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from topod.hostspec import build_host, load_builtin_spec

DEMO_HOST = "h800-8gpu"
CONFIG = """\
[irq]
mode = "continuous"      # the demo host's IRQs all start on CPU 0: watch topod spread them
interval_seconds = 2
[probe]
enabled = false
[alloc]
reserved_cpus = "0,32"   # housekeeping core for the OS
"""


def _topoctl(socket: str, *args: str) -> int:
    print(f"\n$ topoctl {' '.join(args)}", flush=True)
    env = dict(os.environ, TOPOD_SOCKET=socket)
    return subprocess.call([sys.executable, "-m", "topod.cli.topoctl", *args], env=env)


def _wait_for(socket: str, daemon: subprocess.Popen, timeout: float = 20.0) -> None:
    from topod.client import ApiError, Client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"topod exited with {daemon.returncode}")
        try:
            Client(socket).health()
            return
        except ApiError:
            time.sleep(0.1)
    raise SystemExit("topod did not become ready")


def _show_irqs(socket: str) -> None:
    """What the daemon's IRQ cycle did, from GET /v1/irqs."""
    from topod.client import Client
    from topod.cpulist import format_cpulist

    client = Client(socket)
    report = client.request("GET", "/v1/irqs")
    leased = {cpu for lease in client.leases() for cpu in lease["cpus"]}
    device_irqs = [e for e in report.get("irqs", []) if e.get("class") in ("rdma", "nvme")]
    on_leased = [e for e in device_irqs if set(e.get("planned") or e.get("current") or []) & leased]
    print(f"\n$ curl --unix-socket {socket} http://topod/v1/irqs   (summary)")
    print(f"IRQ cycles: {report.get('cycles')}, mode {report.get('mode')}, RDMA/NVMe IRQs: {len(device_irqs)}, "
          f"on leased CPUs ({format_cpulist(sorted(leased))}): {len(on_leased)}")
    per_cpu = report.get("per_cpu_irqs", {})
    if per_cpu:
        print("IRQs per CPU: " + " ".join(f"{cpu}:{n}" for cpu, n in sorted(per_cpu.items(), key=lambda i: int(i[0]))))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="topod-demo-") as workdir:
        work = Path(workdir)
        root = build_host(load_builtin_spec(DEMO_HOST), work / "host")
        (work / "topod.toml").write_text(CONFIG)
        socket = str(work / "topod.sock")
        print(f"demo host {DEMO_HOST} built at {root}")
        print(f"$ topod --root {root} --socket {socket} --state-dir {work / 'state'} --config {work / 'topod.toml'}")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "topod.service.main", "--root", str(root), "--socket", socket,
             "--state-dir", str(work / "state"), "--config", str(work / "topod.toml"), "--log-format", "console"],
            stderr=open(work / "daemon.log", "w"))
        try:
            _wait_for(socket, daemon)
            code = 0
            code |= _topoctl(socket, "topo", "--root", str(root))
            code |= _topoctl(socket, "allocate", "--gpus", "4", "--level", "good", "--cpus-per-gpu", "4",
                             "--job", "llm-70b")
            code |= _topoctl(socket, "allocate", "--gpus", "2", "--level", "best", "--cpus-per-gpu", "2",
                             "--job", "finetune")
            code |= _topoctl(socket, "leases")
            time.sleep(2.5)  # one IRQ cycle after the leases
            _show_irqs(socket)
            code |= _topoctl(socket, "status")
            from topod.client import Client

            for lease in Client(socket).leases():
                code |= _topoctl(socket, "release", lease["id"])
            code |= _topoctl(socket, "leases")
        finally:
            daemon.send_signal(signal.SIGTERM)
            status = daemon.wait(timeout=15)
            print(f"\ntopod stopped (exit {status}); its log:")
            print("".join((work / "daemon.log").read_text().splitlines(keepends=True)[-12:]))
        return 1 if code or status else 0


if __name__ == "__main__":
    sys.exit(main())
