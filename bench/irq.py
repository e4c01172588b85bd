"""IRQ planner and cycle cost. One line per figure; medians of several runs.

  python bench/irq.py [--runs N]

1. plan time for 4,096 IRQs on 512 CPUs (8 nodes x 32 cores x 2 threads, 64 devices x 64
   queues), built in memory: count-only and with load refinement, against a naive
   round-robin over each device's node measured in the same run (goal: <= 20 ms);
2. plan time on the built-in h800-8gpu host (classification + plan from a real snapshot);
3. CPU time of one steady-state cycle on that host (read /proc + classify + plan + no-op
   apply), after convergence;
4. a lease change: one steady full cycle against one `replan()` (the incremental re-plan:
   no /proc scan, only the IRQs whose candidate CPUs changed), on the h800-8gpu host and on
   a storm host of 4,096 IRQs on 512 CPUs written out as a /proc tree (write_storm_tree).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topod.discover import discover  # noqa: E402
from topod.host import HostRoot  # noqa: E402
from topod.hostspec import build_host, load_builtin_spec  # noqa: E402
from topod.irq import IrqBalancer, IrqSettings, PlanInput, plan_irqs  # noqa: E402
from topod.irq.classify import IrqInfo, classify_irqs  # noqa: E402
from topod.irq.procfs import read_snapshot  # noqa: E402
from topod.cpulist import format_cpulist  # noqa: E402
from topod.model import Cpu, NumaNode, NvlinkFabric, PciDevice, Topology  # noqa: E402


def line(name: str, value: str) -> None:
    print(f"{name}: {value}", flush=True)


def median_ms(fn, runs: int, clock=time.perf_counter) -> float:
    times = []
    for _ in range(runs):
        start = clock()
        fn()
        times.append((clock() - start) * 1000)
    return statistics.median(times)


def big_topology(nodes: int = 8, cores: int = 32, threads: int = 2, devices_per_node: int = 8) -> Topology:
    total = nodes * cores
    cpus, node_cpus = [], {n: [] for n in range(nodes)}
    for thread in range(threads):
        for core in range(total):
            cpu, node = thread * total + core, core // cores
            node_cpus[node].append(cpu)
            cpus.append(Cpu(cpu, True, core % cores, node // 2, node, tuple(t * total + core for t in range(threads)),
                            node * cores))
    numa = tuple(NumaNode(n, tuple(sorted(node_cpus[n])), {m: 10 if m == n else (12 if m // 2 == n // 2 else 32)
                                                           for m in range(nodes)}, None) for n in range(nodes))
    devices = tuple(PciDevice(f"0000:{i:02x}:00.0", 0x15B3, 0x1021, 0x020700, "rdma", "mlx5_core", None, "pci0000:00",
                              None, None, i % nodes, i % nodes, "firmware", tuple(sorted(node_cpus[i % nodes])), None,
                              (), (f"mlx5_{i}",)) for i in range(nodes * devices_per_node))
    return Topology("/", numa, tuple(sorted(cpus, key=lambda c: c.id)), devices, (), NvlinkFabric(), ())


def big_inputs(topology: Topology, queues: int = 64, weights: bool = False) -> PlanInput:
    irqs, current, irq = {}, {}, 64
    for device in topology.pci_devices:
        for q in range(queues):
            irqs[irq] = IrqInfo(irq, f"mlx5_comp{q}@pci:{device.address}", device.address, "rdma", "queue", q, "name")
            current[irq] = (0,)  # the storm: everything on CPU 0
            irq += 1
    rng = random.Random(1)
    load = {i: rng.choice((100.0, 100.0, 100.0, 5000.0)) for i in irqs} if weights else None
    return PlanInput(irqs, current, leased_cpus=frozenset(range(8)), weights=load)


def naive_round_robin(topology: Topology, inputs: PlanInput) -> dict[int, int]:
    """The baseline: each device's queues round-robin over its node's CPUs, nothing else."""
    cycles = {node.id: itertools.cycle(node.cpus) for node in topology.numa_nodes}
    numa = {d.address: d.numa_node for d in topology.pci_devices}
    return {irq: next(cycles[numa[info.device]]) for irq, info in inputs.irqs.items()}


def bench_big(runs: int) -> None:
    topology = big_topology()
    settings = IrqSettings(mode="continuous")
    counts = big_inputs(topology)
    loaded = big_inputs(topology, weights=True)
    # Steady state: the current placement is the plan's own, so stickiness does the work.
    planned = plan_irqs(topology, counts, settings)
    steady = PlanInput(counts.irqs, {e.irq: e.planned for e in planned.entries}, leased_cpus=counts.leased_cpus)
    base = median_ms(lambda: naive_round_robin(topology, counts), runs)
    storm = median_ms(lambda: plan_irqs(topology, counts, settings), runs)
    settled = median_ms(lambda: plan_irqs(topology, steady, settings), runs)
    refined = median_ms(lambda: plan_irqs(topology, loaded, settings), runs)
    n_irqs, n_cpus = len(counts.irqs), len(topology.cpus)
    line(f"plan {n_irqs} IRQs / {n_cpus} CPUs, storm, count-only (median ms)",
         f"{storm:.2f} (naive round-robin baseline {base:.2f}, x{storm / base:.1f}; goal <= 20)")
    line(f"plan {n_irqs} IRQs / {n_cpus} CPUs, steady, count-only (median ms)", f"{settled:.2f}")
    line(f"plan {n_irqs} IRQs / {n_cpus} CPUs, storm, with load refinement (median ms)",
         f"{refined:.2f} (x{refined / base:.1f} baseline)")


def bench_host(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = build_host(load_builtin_spec("h800-8gpu"), Path(tmp) / "h800")
        host = HostRoot(root)
        topology = discover(host)
        snapshot = read_snapshot(host, 0.0)
        settings = IrqSettings(mode="continuous")

        def plan() -> None:
            irqs = classify_irqs(topology, snapshot.interrupts)
            plan_irqs(topology, PlanInput(irqs, {i: a.requested for i, a in snapshot.affinity.items()}), settings)

        ms = median_ms(plan, runs)
        line(f"plan on h800-8gpu ({len(snapshot.interrupts.lines)} IRQs, {len(topology.cpus)} CPUs; median ms)",
             f"{ms:.2f}")
        balancer = IrqBalancer(host, settings)
        for _ in range(3):
            balancer.cycle(topology)  # converge (the first cycle moves the storm)
        read_only = median_ms(lambda: read_snapshot(host, time.monotonic()), runs, time.process_time)
        cycle = median_ms(lambda: balancer.cycle(topology), runs, time.process_time)
        assert balancer.last is not None and balancer.last.moves == 0
        line("steady-state cycle on h800-8gpu, read+plan+no-op apply (median CPU ms)",
             f"{cycle:.2f} (of which reading /proc {read_only:.2f})")


def write_storm_tree(root: Path, topology: Topology, inputs: PlanInput) -> Path:
    """A /proc tree for the in-memory storm host: /proc/interrupts with one column per CPU
    (each IRQ's interrupts on the CPU it is delivered to), /proc/irq/N/*_affinity_list,
    /proc/stat and /proc/softirqs. The Topology stays in memory (the cycle reads no /sys)."""
    cpus = [cpu.id for cpu in topology.cpus]
    column = {cpu: i for i, cpu in enumerate(cpus)}
    rng = random.Random(3)
    lines = ["".join(f"{'CPU' + str(cpu):>11}" for cpu in cpus)]
    for irq, info in sorted(inputs.irqs.items()):
        where = inputs.current[irq] or (0,)
        counts = ["0"] * len(cpus)
        counts[column[where[0]]] = str(rng.randrange(1, 10**7))
        lines.append(f"{irq:>4}: " + " ".join(f"{c:>10}" for c in counts)
                     + f"  IR-PCI-MSIX-{info.device}  {info.queue}-edge  {info.name}")
        base = root / f"proc/irq/{irq}"
        base.mkdir(parents=True)
        (base / "smp_affinity_list").write_text(format_cpulist(list(where)) + "\n")
        (base / "effective_affinity_list").write_text(format_cpulist(list(where)) + "\n")
    (root / "proc/interrupts").write_text("\n".join(lines) + "\n")
    (root / "proc/stat").write_text("".join(f"cpu{cpu} 10 0 10 1000 0 {rng.randrange(100)} {rng.randrange(100)} 0 0 0\n"
                                            for cpu in cpus))
    (root / "proc/softirqs").write_text("".join(f"{'CPU' + str(cpu):>11}" for cpu in cpus) + "\n"
                                        + "      NET_RX: " + " ".join("1000" for _ in cpus) + "\n")
    return root


def bench_lease_change(name: str, host: HostRoot, topology: Topology, leased: frozenset[int],
                       lease: frozenset[int], runs: int) -> None:
    """Converge, then time one steady full cycle and one replan() per lease change (a job's
    CPUs leased, then released, in turn)."""
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"))
    for _ in range(3):
        balancer.cycle(topology, leased)  # converge (the first cycle moves the storm)
    assert balancer.cycle(topology, leased).moves == 0
    full = median_ms(lambda: balancer.cycle(topology, leased), runs, time.process_time)
    times, moves, planned, states = [], [], [], [leased | lease, leased]
    for i in range(2 * runs):
        start = time.process_time()
        report = balancer.replan(topology, states[i % 2])
        times.append((time.process_time() - start) * 1000)
        assert report.kind == "replan"
        moves.append(report.moves)
        planned.append(len(report.plan.entries))
    replan = statistics.median(times)
    total = len(balancer.cycle(topology, leased).plan.entries)
    line(f"lease change on {name}: steady full cycle vs replan() (median CPU ms)",
         f"full {full:.2f}, replan {replan:.2f} (x{full / replan:.0f} less); replan planned "
         f"{statistics.median(planned):.0f} of {total} IRQs and moved {statistics.median(moves):.0f} (medians)")


def bench_replan(runs: int, storm_runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = build_host(load_builtin_spec("h800-8gpu"), Path(tmp) / "h800")
        host = HostRoot(root)
        topology = discover(host)
        node0 = topology.node(0).cpus
        bench_lease_change("h800-8gpu (108 IRQs, 64 CPUs; lease 8 CPUs of node 0)", host, topology,
                           frozenset(), frozenset(node0[2:10]), runs)
    with tempfile.TemporaryDirectory() as tmp:
        topology = big_topology()
        inputs = big_inputs(topology)
        host = HostRoot(write_storm_tree(Path(tmp), topology, inputs))
        node3 = topology.node(3).cpus
        bench_lease_change(f"storm host ({len(inputs.irqs)} IRQs, {len(topology.cpus)} CPUs; lease 16 CPUs "
                           "of node 3)", host, topology, inputs.leased_cpus, frozenset(node3[:16]), storm_runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--storm-runs", type=int, default=5, help="runs of the 4,096-IRQ full cycle (slow)")
    args = parser.parse_args()
    bench_big(args.runs)
    bench_host(args.runs)
    bench_replan(args.runs, args.storm_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
