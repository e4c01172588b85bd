"""Probe cost and real transfer figures. One line per figure; medians of several runs.

  python bench/probe.py [--cycles N]

1. host-memory backend on this machine: cost per cycle (time, bytes), copy bandwidth and
   latency vs an unpinned, unbound memmove baseline measured in the same run;
2. share of wall time at default settings (dense: every min interval; settled: every max
   interval; and a simulated day of lease churn through the real Sampler);
3. simulated backend on the pcie-8gpu host: transfer cost per cycle and topod's own CPU
   overhead per cycle;
4. CUDA (when an NVIDIA GPU and cuda-python are present): pinned H2D/D2H latency and
   bandwidth from the GPU's own node and a remote node, and the probe cost per cycle;
   otherwise one line saying it was skipped and why.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topod.discover import discover  # noqa: E402
from topod.host import HostRoot  # noqa: E402
from topod.hostspec import build_host, load_builtin_spec  # noqa: E402
from topod.probe.backend import ProbeUnavailable  # noqa: E402
from topod.probe.hostmem import DEFAULT_SIZES, HostMemoryBackend  # noqa: E402
from topod.probe.linkstate import LinkState  # noqa: E402
from topod.probe.sampler import Sampler, SamplerSettings, run_cycle  # noqa: E402
from topod.probe.simulated import SimulatedBackend  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "links" / "pcie-8gpu-uplink-degrades.json"


def line(name: str, value: str) -> None:
    print(f"{name}: {value}", flush=True)


def baseline_memmove(size: int, reps: int) -> float:
    """GB/s of a plain memmove between unbound buffers on whatever CPU the OS picks."""
    src, dst = ctypes.create_string_buffer(size), ctypes.create_string_buffer(size)
    ctypes.memset(src, 1, size)
    ctypes.memset(dst, 0, size)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        ctypes.memmove(dst, src, size)
        rates.append(size / max(1, time.perf_counter_ns() - t0))
    return statistics.median(rates)


def bench_host_memory(cycles: int) -> float | None:
    topology = discover(HostRoot("/"), live_nvml=False)
    try:
        backend = HostMemoryBackend.from_topology(topology)
    except ProbeUnavailable as exc:
        line("host-memory", f"skipped: {exc}")
        return None
    links = backend.links()
    costs, by_link = [], {}
    for _ in range(cycles):
        started = time.perf_counter()
        for link in links:
            by_link.setdefault(link, []).append(backend.measure(link))
        costs.append(time.perf_counter() - started)
    cost = statistics.median(costs)
    moved = DEFAULT_SIZES.bytes_per_link * len(links)
    nodes = len(topology.numa_nodes)
    line("host-memory binding", f"{backend.binding_used}, {nodes} NUMA node(s), {len(links)} link(s)")
    line("host-memory cycle time", f"{cost * 1e3:.1f} ms (median of {cycles} cycles)")
    s = DEFAULT_SIZES
    line("host-memory cycle bytes", f"{moved / 2**20:.1f} MiB copied ({s.large_reps} x {s.large_bytes >> 20} MiB + "
         f"{s.small_reps} x {s.small_bytes} B per link; 2 x {s.large_bytes >> 20} MiB touched to place buffers)")
    base = baseline_memmove(DEFAULT_SIZES.large_bytes, 9)
    for link, results in sorted(by_link.items()):
        bw = statistics.median(r.bandwidth_gbps for r in results)
        lat = statistics.median(r.latency_us for r in results)
        line(f"host-memory {link} bandwidth",
             f"{bw:.2f} GB/s; unbound baseline {base:.2f} GB/s; ratio {bw / base:.2f}")
        line(f"host-memory {link} latency", f"{lat:.3f} us per {s.small_bytes} B copy (Python call included)")
    return cost


def bench_share(cost: float) -> None:
    settings = SamplerSettings()
    dense = max(settings.min_interval_s, cost / settings.budget_share)
    line("share of wall time, dense (every min interval)",
         f"{cost / dense:.4%} (interval {dense:.0f} s, budget {settings.budget_share:.0%})")
    line("share of wall time, settled (every max interval)", f"{cost / settings.max_interval_s:.5%}")
    # A day in which a lease changes every 10 minutes, each reset asking for probes again.
    sampler, now, day = Sampler(settings, started=0.0), 0.0, 86_400.0
    next_lease = 600.0
    while now < day:
        now = max(now, sampler.due_at())
        if now >= next_lease:
            sampler.on_lease_change(next_lease)
            next_lease += 600.0
            continue
        sampler.record(cost, 0, stable=True, now=now + cost)
        now += cost
    line("share of wall time, simulated day with a lease change every 10 min",
         f"{sampler.share(day):.4%} ({sampler.cycles} cycles)")


def bench_simulated(cycles: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        topology = discover(HostRoot(build_host(load_builtin_spec("pcie-8gpu"), tmp)), live_nvml=False)
    clock = [0.0]
    backend = SimulatedBackend.from_file(FIXTURE, topology, clock=lambda: clock[0])
    state = LinkState(backend.links())
    sampler = Sampler(SamplerSettings(), started=0.0)
    simulated, overhead = [], []
    for i in range(cycles):
        clock[0] = float(i * 30)
        started = time.perf_counter()
        report = run_cycle(backend, state, sampler, clock=lambda: clock[0])
        overhead.append(time.perf_counter() - started)
        simulated.append(report.summary.seconds)
    line("simulated pcie-8gpu cycle", f"{len(backend.links())} links, {statistics.median(simulated) * 1e3:.0f} ms of "
         f"transfers, {report.summary.bytes_moved / 2**30:.2f} GiB, interval floor at 1% "
         f"{statistics.median(simulated) / 0.01:.0f} s")
    line("simulated pcie-8gpu topod overhead", f"{statistics.median(overhead) * 1e3:.2f} ms CPU per cycle "
         f"(median of {cycles})")


def bench_cuda(cycles: int) -> None:
    from topod.probe.cuda import CudaBackend, cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is not None:
        line("cuda", f"skipped: {reason}")
        return
    topology = discover(HostRoot("/"), live_nvml=False)
    try:
        backend = CudaBackend.open(topology)
    except ProbeUnavailable as exc:
        line("cuda", f"skipped: {exc}")
        return
    try:
        gpu = topology.gpus[0]
        local = gpu.numa_node if gpu.numa_node is not None else 0
        nodes = [local] + [n.id for n in topology.numa_nodes if n.id != local][:1]
        links = [link for link in backend.links()
                 if link.device == gpu.address and link.host_node in nodes]
        results: dict = {}
        costs = []
        for _ in range(cycles):
            started = time.perf_counter()
            for link in links:
                results.setdefault(link, []).append(backend.measure(link))
            costs.append(time.perf_counter() - started)
        local_h2d = None
        for link, rs in sorted(results.items(), key=lambda item: (item[0].host_node != local, str(item[0]))):
            where = "local" if link.host_node == local else "remote"
            bw = statistics.median(r.bandwidth_gbps for r in rs)
            lat = statistics.median(r.latency_us for r in rs)
            if link.kind == "h2d" and where == "local":
                local_h2d = bw
            ratio = f"; vs local H2D {bw / local_h2d:.2f}" if local_h2d and link.kind == "h2d" else ""
            line(f"cuda GPU{gpu.index} {link.kind} {where} node{link.host_node}",
                 f"{bw:.2f} GB/s, {lat:.1f} us per {rs[0].sizes.small_bytes} B{ratio}")
        line(f"cuda probe cost GPU{gpu.index}", f"{statistics.median(costs) * 1e3:.1f} ms for {len(links)} links; "
             f"all {len(backend.links())} links of this host ~ "
             f"{statistics.median(costs) / max(1, len(links)) * len(backend.links()) * 1e3:.0f} ms per cycle")
    finally:
        backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    cost = bench_host_memory(args.cycles)
    if cost is not None:
        bench_share(cost)
    bench_simulated(args.cycles)
    bench_cuda(args.cycles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
