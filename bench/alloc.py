"""Allocation engine figures, one line each, baselines measured in the same run.

  python bench/alloc.py [--quick] [--latency-only]

1. warm decision latency p50/p99 on 8-, 16-, 32- and 64-GPU hosts over a seeded
   allocate/release stream (sizes 1,2,4,8 mostly, some 16; leases hold GPUs and CPUs),
   at the default level with auto cores (goal p99: 0.2 / 1 / 2 / 5 ms), wall clock and
   this thread's CPU time (which other processes on a shared machine do not move), and
   the decisions the engine had not made before apart (its memo answers the others),
   beside level 'any' without cores; then the first decision of each size after
   prepare() (what the daemon runs when the topology changes) beside the warm median,
   on the empty host (prepare() decided it) and with one GPU leased (a new state, its
   warm median computed again with the engine's memos emptied);
2. optimality: chosen cost / exhaustive minimum for every size on every 8-GPU fixture
   and two 16-GPU synthetic hosts, empty and with busy GPUs (goal 1.000);
3. speed at 16 GPUs against go-gpuallocator's best-effort policy (bench/gpuallocator_baseline.py,
   Python like topod): full calls where they finish within a budget, else a bounded run
   extrapolated from its measured partition rate and the exact partition count (said so);
   topod's decision computed each time (its memos of decisions and searches emptied);
4. trace replay on the 8-GPU fixtures: share of multi-GPU grants at level 'best' and mean
   topology satisfaction, for topod, first-fit and best-effort on the same stream (seed
   2024); then the same replay over more seeds, the mean and spread of the share at the
   exhaustive minimum, since one stream's figure moves by a few points with the seed.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuallocator_baseline import BestEffort, Deadline, first_fit, partition_count  # noqa: E402

from topod.alloc.engine import allocate, assess, prepare  # noqa: E402
from topod.alloc.errors import AllocationError  # noqa: E402
from topod.alloc.hostview import host_view  # noqa: E402
from topod.alloc.request import FreeState, Request  # noqa: E402
from topod.hostspec.synthetic import build_synthetic  # noqa: E402
from topod.discover import discover  # noqa: E402
from topod.distance import DistanceModel  # noqa: E402
from topod.host import HostRoot  # noqa: E402
from topod.hostspec import build_host, load_builtin_spec  # noqa: E402

FIXTURES = ("h800-8gpu", "pcie-8gpu", "nps4-8gpu", "dgx1-cubemesh")
SIZE_MIX = ((1, 30), (2, 30), (4, 20), (8, 15), (16, 5))
TRACE_MIX = ((1, 35), (2, 30), (4, 20), (8, 10), (3, 5))
LATENCY_HOSTS = ("h800-8gpu", "pcie-8gpu", "dgx1-cubemesh", "pcie-16gpu", "nvs-16gpu", "nvs-32gpu", "nvs-64gpu",
                 "pcie-64gpu")


def line(name: str, value: str) -> None:
    print(f"{name}: {value}", flush=True)


def load(name: str):
    """The host's topology and distances, discovered from a tree built for it and removed
    once read."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as directory:
        if name in FIXTURES:
            topology = discover(HostRoot(build_host(load_builtin_spec(name), directory)), live_nvml=False)
        else:
            topology = build_synthetic(name, directory)
        return topology, DistanceModel(topology)


def _pick(rng: random.Random, mix) -> int:
    return rng.choices([k for k, _ in mix], [w for _, w in mix])[0]


@dataclass
class Latency:
    p50: float  # wall clock, ms
    p99: float
    count: int
    cpu_p50: float  # this thread's CPU time, ms: what other processes on the machine do not move
    cpu_p99: float
    fresh: int  # decisions the engine computed (not a state and request it had decided before)
    fresh_p99: float  # wall clock p99 of those, ms


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1e3 if values else 0.0


def latency(name: str, steps: int, level: str = "any", cpus: int | str = 0, loaded=None) -> Latency:
    """Warm decisions (prepared and the heap frozen, as the daemon does at start and
    after each topology change) over a seeded allocate/release stream; leases hold their
    GPUs, CPUs and NIC ports (the free state counts them as the daemon's does). Wall
    clock and CPU time per decision, and apart the decisions the engine had not made
    before (its memo of recent decisions did not hold them)."""
    topology, distances = loaded or load(name)
    n = len(topology.gpus)
    prepare(topology, distances)
    gc.collect()
    gc.freeze()
    rng = random.Random(11)
    returned: dict[int, object] = {}  # id -> decision, kept alive so an id means one decision
    fresh = []
    cpu_times = []
    busy: set[int] = set()
    busy_cpus: set[int] = set()
    nic_use: dict[str, int] = {}  # NIC port -> leases carrying it, as the daemon's free state has it
    leases: list[tuple[tuple[int, ...], set[int], list[str]]] = []
    times = []
    for _ in range(steps):
        if leases and (rng.random() < 0.45 or len(busy) > 0.8 * n):
            gpus, held, nics = leases.pop(rng.randrange(len(leases)))
            busy -= set(gpus)
            busy_cpus -= held
            for key in nics:
                nic_use[key] -= 1
                if not nic_use[key]:
                    del nic_use[key]
            continue
        k = min(_pick(rng, SIZE_MIX), n)
        state = FreeState(busy_gpus=frozenset(busy), busy_cpus=frozenset(busy_cpus), busy_nics=frozenset(nic_use),
                          nic_use=dict(nic_use), lease_gpus=tuple(frozenset(gpus) for gpus, _, _ in leases))
        cpu_started = time.thread_time()
        started = time.perf_counter()
        try:
            decision = allocate(topology, distances, state, Request(gpus=k, level=level, cpus_per_gpu=cpus))
        except AllocationError:
            decision = None
        times.append(time.perf_counter() - started)
        cpu_times.append(time.thread_time() - cpu_started)
        if decision is None or id(decision) not in returned:
            fresh.append(times[-1])
        if decision is not None:
            returned[id(decision)] = decision
            held = {c for group in decision.cpus.values() for c in group}
            nics = [choice.key for placement in decision.placements for choice in placement.nics]
            busy |= set(decision.gpus)
            busy_cpus |= held
            for key in nics:
                nic_use[key] = nic_use.get(key, 0) + 1
            leases.append((decision.gpus, held, nics))
    gc.unfreeze()
    return Latency(_p(times, 0.5), _p(times, 0.99), len(times), _p(cpu_times, 0.5), _p(cpu_times, 0.99),
                   len(fresh), _p(fresh, 0.99))


def first_decisions(name: str, loaded=None) -> str:
    """A fresh distance model (as after a topology change): prepare()'s time, then the
    first decision of each size (default level, auto cores) beside the warm median: on
    the empty host, which prepare() decided already (warm: asked again), and with GPU 0
    leased, a state it did not see (warm: the same decision computed again with the
    engine's memos of decisions and searches emptied, so both compute it whole)."""
    topology, _ = loaded or load(name)
    distances = DistanceModel(topology)
    n = len(topology.gpus)
    started = time.perf_counter()
    prepare(topology, distances)
    prepared = time.perf_counter() - started
    out = [f"prepare {prepared * 1e3:.1f} ms"]
    for label, state in (("empty host", FreeState()),
                         ("GPU 0 leased", FreeState(busy_gpus=frozenset({topology.gpus[0].index})))):
        parts, worst = [], 0.0
        for k in (k for k in (1, 2, 3, 4, 8, 16, 32, 64) if k <= n - len(state.busy_gpus)):
            request = Request(gpus=k, cpus_per_gpu="auto")
            started = time.perf_counter()
            try:
                allocate(topology, distances, state, request)
            except AllocationError:
                continue
            first = time.perf_counter() - started
            warm = []
            for _ in range(15):
                if label != "empty host":  # the same work again: computed, not answered from the memos
                    view = host_view(topology, distances)
                    view.decision_memo.clear()
                    view.search_memo.clear()
                started = time.perf_counter()
                allocate(topology, distances, state, request)
                warm.append(time.perf_counter() - started)
            ratio = first / statistics.median(warm)
            worst = max(worst, ratio)
            parts.append(f"{k}: {first * 1e3:.2f}/{statistics.median(warm) * 1e3:.3f}")
        out.append(f"{label}: first/warm ms per size {', '.join(parts)}; worst first/warm {worst:.2f}x")
    return "; ".join(out)


def exhaustive_minima(weight: list[list[float]], pool: list[int]) -> dict[int, float]:
    """Minimum cost per size over every subset of pool (incremental DFS, 2^n leaves)."""
    best: dict[int, float] = {}
    chosen: list[int] = []

    def visit(start: int, cost: float) -> None:
        size = len(chosen)
        if size and cost < best.get(size, float("inf")):
            best[size] = cost
        for i in range(start, len(pool)):
            g = pool[i]
            extra = sum(weight[g][c] for c in chosen)
            chosen.append(g)
            visit(i + 1, cost + extra)
            chosen.pop()

    visit(0, 0.0)
    return best


def optimality(names) -> tuple[float, float, int, int]:
    ratios, exact = [], 0
    for name in names:
        topology, distances = load(name)
        indices = [g.index for g in topology.gpus]
        weight = {a: {b: distances.gpus(a, b).weight for b in indices} for a in indices}
        rng = random.Random(name)
        for busy in (frozenset(), frozenset(rng.sample(indices, len(indices) // 4))):
            pool = [g for g in indices if g not in busy]
            minima = exhaustive_minima(weight, pool)
            for k in range(1, len(pool) + 1):
                decision = allocate(topology, distances, FreeState(busy_gpus=busy), Request(gpus=k, level="any"))
                ratios.append(decision.cost / minima[k] if minima[k] > 0 else (1.0 if decision.cost == 0 else float("inf")))
                exact += decision.exact
    return max(ratios), statistics.fmean(ratios), exact, len(ratios)


def speed_vs_best_effort(name: str, budget_s: float) -> list[str]:
    topology, distances = load(name)
    indices = [g.index for g in topology.gpus]
    baseline = BestEffort(topology)
    out = []
    for k in (2, 4, 8):
        allocate(topology, distances, FreeState(), Request(gpus=k, level="any"))
        runs = []
        view = host_view(topology, distances)
        for _ in range(50):
            view.decision_memo.clear()  # the decision computed each time, not answered from the memos
            view.search_memo.clear()
            started = time.perf_counter()
            allocate(topology, distances, FreeState(), Request(gpus=k, level="any"))
            runs.append(time.perf_counter() - started)
        ours = statistics.median(runs)
        baseline.partitions = 0
        started = time.perf_counter()
        try:
            baseline.allocate(indices, [], k, deadline=started + budget_s)
            theirs, how = time.perf_counter() - started, "full call"
        except Deadline:
            spent = time.perf_counter() - started
            total = partition_count(len(indices), k)
            theirs = spent * total / baseline.partitions
            how = f"extrapolated: {baseline.partitions} of {total} partitions in {spent:.1f} s"
        out.append(f"size {k}: topod {ours * 1e3:.3f} ms, best-effort {theirs:.2f} s ({how}), "
                   f"topod {theirs / ours:,.0f}x faster")
    return out


@dataclass
class TraceScore:
    at_best: float  # multi-GPU grants whose cost equals the host's exhaustive minimum for the size
    at_search_best: float  # ... and that cross no more NUMA node pairs than the cheapest sets must
    best_per_request: float  # multi-GPU requests that got such a set, of all multi-GPU requests
    assessed_best: float  # the same judged by topod's own assess() (levels), for comparison
    satisfaction: float
    granted: float
    refused_with_room: int  # requests refused although enough GPUs were free
    largest_block: float  # mean over steps of the largest free set inside one NUMA node


def search_minima(weight, node_of, pool: list[int]) -> dict[int, tuple[float, int]]:
    """Per size, the least (cost, pairs crossing NUMA nodes) over every subset of pool: the
    search's own order (cost first, fewer crossings among equals), computed here apart
    from the engine."""
    best: dict[int, tuple[float, int]] = {}
    chosen: list[int] = []

    def visit(start: int, cost: float, crossings: int) -> None:
        size = len(chosen)
        if size:
            old = best.get(size)
            if old is None or cost < old[0] - 1e-9 or (abs(cost - old[0]) <= 1e-9 and crossings < old[1]):
                best[size] = (cost, crossings)
        for i in range(start, len(pool)):
            g = pool[i]
            extra = sum(weight[g][c] for c in chosen)
            cross = sum(node_of[g] != node_of[c] for c in chosen)
            chosen.append(g)
            visit(i + 1, cost + extra, crossings + cross)
            chosen.pop()

    visit(0, 0.0, 0)
    return best


def trace(name: str, events: int, seed: int = 2024, loaded=None, refusing: bool = False) -> dict[str, TraceScore]:
    """Replay one random job trace per allocator. Each multi-GPU grant is scored against
    the exhaustive minimum cost for its size on the empty host, computed here from the
    pairwise weights and independent of the engine, and against the search's own order
    (that cost, then the fewest pairs crossing NUMA nodes); fragmentation is the largest
    free one-node block over time, and requests refused while enough GPUs were free.
    With refusing, also topod at level 'best', which refuses any set that is not the
    host's best (by the search's order) and so trades grants for their quality."""
    topology, distances = loaded or load(name)
    indices = [g.index for g in topology.gpus]
    node_of = {g.index: g.numa_node for g in topology.gpus}
    weight = {a: {b: distances.gpus(a, b).weight for b in indices} for a in indices}
    minima = exhaustive_minima(weight, indices)
    ordered = search_minima(weight, node_of, indices)
    best_effort = BestEffort(topology)

    def topod(level: str):
        # The running jobs' GPU sets, as the daemon gives its leases' (which GPUs free together).
        return lambda free, k, jobs: list(allocate(topology, distances,
                                                   FreeState(busy_gpus=frozenset(set(indices) - set(free)),
                                                             lease_gpus=tuple(map(frozenset, jobs))),
                                                   Request(gpus=k, level=level)).gpus)

    allocators = {"topod": topod("any"), "first-fit": lambda free, k, jobs: first_fit(free, k),
                  "best-effort": lambda free, k, jobs: best_effort.allocate(free, [], k)}
    if refusing:
        allocators["topod-best"] = topod("best")
    results = {}
    for label, choose in allocators.items():
        rng = random.Random(seed)
        running: list[tuple[int, list[int]]] = []
        free = list(indices)
        granted = asked = best = searched = multi_asked = assessed = refused_with_room = 0
        satisfaction, blocks = [], []
        for step in range(events):
            for end, gpus in [r for r in running if r[0] <= step]:
                running.remove((end, gpus))
                free.extend(gpus)
            per_node: dict[object, int] = {}
            for g in free:
                per_node[node_of[g]] = per_node.get(node_of[g], 0) + 1
            blocks.append(max(per_node.values(), default=0))
            k = _pick(rng, TRACE_MIX)
            duration = int(rng.expovariate(1 / 6.0)) + 1
            asked += 1
            multi_asked += k > 1
            if len(free) < k:
                continue
            try:
                gpus = choose(sorted(free), k, [gpus for _, gpus in running])
            except AllocationError:
                gpus = []
            if not gpus:
                refused_with_room += 1
                continue
            granted += 1
            for g in gpus:
                free.remove(g)
            running.append((step + duration, gpus))
            if k > 1:
                cost = sum(weight[a][b] for i, a in enumerate(gpus) for b in gpus[i + 1:])
                best += cost <= minima[k] + 1e-9
                crossings = sum(node_of[a] != node_of[b] for i, a in enumerate(gpus) for b in gpus[i + 1:])
                searched += cost <= ordered[k][0] + 1e-9 and crossings <= ordered[k][1]
                verdict = assess(topology, distances, gpus)
                assessed += verdict.level == "best"
                satisfaction.append(verdict.satisfaction)
        multi = len(satisfaction)
        results[label] = TraceScore(best / multi if multi else 0.0, searched / multi if multi else 0.0,
                                    searched / multi_asked if multi_asked else 0.0,
                                    assessed / multi if multi else 0.0,
                                    statistics.fmean(satisfaction) if multi else 1.0, granted / asked,
                                    refused_with_room, statistics.fmean(blocks) if blocks else 0.0)
    return results


def seed_spread(name: str, events: int, seeds: range) -> str:
    """The trace replay (unchanged, all three allocators alike) over several seeds."""
    shares: dict[str, list[float]] = {}
    loaded = load(name)
    for seed in seeds:
        for label, score in trace(name, events, seed, loaded).items():
            shares.setdefault(label, []).append(score.at_best)
    lead = [a - b for a, b in zip(shares["topod"], shares["best-effort"])]
    means = ", ".join(f"{label} {statistics.fmean(values):.1%}" for label, values in shares.items())
    return (f"mean share of multi-GPU grants at the exhaustive minimum: {means}; topod - best-effort "
            f"min {min(lead) * 100:+.1f}, mean {statistics.fmean(lead) * 100:+.1f}, max {max(lead) * 100:+.1f} points")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument("--latency-only", action="store_true", help="decision latency and first decisions only")
    args = parser.parse_args()
    steps = 400 if args.quick else 2000
    started = time.perf_counter()
    goals = {8: 0.2, 16: 1.0, 32: 2.0, 64: 5.0}
    line("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for name in LATENCY_HOSTS:
        loaded = load(name)
        n = len(loaded[0].gpus)
        auto = latency(name, steps, "good", "auto", loaded)
        bare = latency(name, steps, "any", 0, loaded)
        line(f"latency {name} ({n} GPUs)", f"default level, auto cores: p50 {auto.p50:.3f} ms, p99 {auto.p99:.3f} ms "
             f"over {auto.count} decisions (goal p99 {goals[n]} ms: {'met' if auto.p99 <= goals[n] else 'MISSED'}); "
             f"CPU time p50 {auto.cpu_p50:.3f}, p99 {auto.cpu_p99:.3f} ms; the {auto.fresh} not answered from the memo "
             f"(refusals included): p99 {auto.fresh_p99:.3f} ms; level any, no cores: p50 {bare.p50:.3f} ms, "
             f"p99 {bare.p99:.3f} ms (CPU p99 {bare.cpu_p99:.3f} ms)")
        line(f"first decision {name}", first_decisions(name, loaded))
    line("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.latency_only:
        return 0
    worst, mean, exact, cases = optimality((*FIXTURES, "pcie-16gpu", "nvs-16gpu"))
    line("optimality ratio (chosen / exhaustive min)",
         f"max {worst:.6f}, mean {mean:.6f} over {cases} cases (8- and 16-GPU hosts, every size, empty and 1/4 busy); "
         f"proved exact {exact}/{cases} (goal 1.000)")
    for text in speed_vs_best_effort("nvs-16gpu", budget_s=1.0 if args.quick else 4.0):
        line("speed vs go-gpuallocator best-effort, nvs-16gpu", text)
    for name in FIXTURES:
        for label, score in trace(name, 300 if args.quick else 1500).items():
            line(f"trace {name} {label}",
                 f"multi-GPU grants at the exhaustive minimum {score.at_best:.1%} (and fewest node crossings: "
                 f"{score.at_search_best:.1%}; topod's assess: "
                 f"{score.assessed_best:.1%}), mean satisfaction {score.satisfaction:.3f}, requests granted "
                 f"{score.granted:.1%}, refused with enough GPUs free {score.refused_with_room}, "
                 f"mean largest free one-node block {score.largest_block:.2f}")
    seeds = range(2024, 2024 + (5 if args.quick else 20))
    for name in FIXTURES:
        line(f"trace {name} over seeds {seeds[0]}-{seeds[-1]}", seed_spread(name, 300 if args.quick else 1500, seeds))
    line("bench wall time", f"{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
