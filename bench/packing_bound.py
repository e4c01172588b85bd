"""The ceiling for packing: the best share of multi-GPU grants at the host's exhaustive
minimum that ANY online allocator can expect on bench/alloc.py's job trace, beside topod
and go-gpuallocator's best-effort on the same streams.

The trace is a Markov decision process. Each step a request of k GPUs arrives (k drawn
from TRACE_MIX) and is granted when k GPUs are free; each running job ends at the start
of a later step with probability q = 1 - exp(-1/6) per step, independently (the trace's
int(expovariate(1/6)) + 1 durations are exactly geometric). The allocator chooses which
k free GPUs, not when: how many GPUs are free evolves alike under every allocator, so
maximising best grants per step maximises their share. States are the running jobs' GPU
sets, folded by the host's symmetries (permutations keeping every pairwise weight);
actions are all k-sets of the free GPUs (any cost, so the ceiling also covers allocators
that pay cost now to keep sets for later); reward 1 when a grant of k >= 2 is the empty
host's best for k, by one of two measures, each with its own optimal policy:
- cost: it costs the exhaustive minimum (a DGX-1's cross-socket NVLink pairs count);
- search order: that cost and no more pairs crossing NUMA nodes than the cheapest sets
  must (what topod's search minimises and its level 'best' means).
Relative value iteration gives the optimal policy; it is replayed on the seeds
bench/alloc.py uses. An allocator that does not know the future cannot beat this policy
in expectation; on one stream it can, by luck, by a little.

Two topod policies are reported, each told the running jobs' GPU sets (which GPUs come
back together), as the daemon tells it its leases'. Level 'any' grants at once (the
cheapest free set), so the ceiling bounds it. Level 'best' refuses any set that is not the host's best: every
grant it makes is best, but it turns requests away, so the free GPUs evolve differently
and the ceiling does not bound it; the figure comparable across all of them is the
share of multi-GPU requests (granted or not) that got a best set.

Beside the ceiling, the same optimal policy restricted to the free k-sets of least cost
(then fewest node crossings): level 'any' promises the cheapest free set, so this is the
most any look-ahead choosing among equal-cost sets could get, without trading cost for
packing as the unrestricted ceiling may.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import alloc as trace_bench  # noqa: E402  (bench/alloc.py: the trace, its hosts, best-effort)

from topod.alloc.hostview import host_view  # noqa: E402

HOSTS = ("pcie-8gpu", "nps4-8gpu", "dgx1-cubemesh")  # h800-8gpu: every set is minimal, all score 100 %
EVENTS = 1500
SEEDS = range(2024, 2044)
ITERATIONS = 400
TOLERANCE = 1e-9
END_PROBABILITY = 1 - math.exp(-1 / 6.0)


def set_cost(weight: list[list[float]], members) -> float:
    return sum(weight[a][b] for i, a in enumerate(members) for b in members[i + 1:])


def bits(members) -> int:
    mask = 0
    for g in members:
        mask |= 1 << g
    return mask


METRICS = ("cost", "search order")


class Ceiling:
    def __init__(self, name: str, cheapest_only: bool = False) -> None:
        """cheapest_only: the policy may choose only among the free k-sets of least cost,
        then fewest pairs crossing NUMA nodes (the search's order): what level any promises,
        so the optimal policy under that rule is the ceiling of any look-ahead topod could
        have without trading cost for packing."""
        self.cheapest_only = cheapest_only
        self.loaded = trace_bench.load(name)
        topology, distances = self.loaded
        view = host_view(topology, distances)
        self.n = n = view.n
        self.weight = view.weight
        self.node = node = view.node
        self.minimum = trace_bench.exhaustive_minima(self.weight, list(range(n)))
        self.ordered = trace_bench.search_minima(self.weight, node, list(range(n)))
        # Symmetries keep every weight and whether a pair crosses nodes (valid for both measures).
        self.symmetries = [p for p in itertools.permutations(range(n))
                           if all(abs(self.weight[a][b] - self.weight[p[a]][p[b]]) < 1e-9
                                  and (node[a] == node[b]) == (node[p[a]] == node[p[b]])
                                  for a in range(n) for b in range(a + 1, n))]
        self.relabel = [[bits(p[g] for g in range(n) if mask >> g & 1) for mask in range(1 << n)]
                        for p in self.symmetries]
        total = sum(w for _, w in trace_bench.TRACE_MIX)
        self.sizes = [(k, w / total) for k, w in trace_bench.TRACE_MIX]
        self._options: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def canonical(self, jobs) -> tuple[int, ...]:
        return min(tuple(sorted(table[j] for j in jobs)) for table in self.relabel)

    def options(self, free_mask: int, k: int) -> list[tuple[int, tuple[int, int]]]:
        """(the k-set as a mask, its rewards by METRICS: 1 if k >= 2 and it is the host's
        best for k by that measure) for every k-set."""
        key = (free_mask, k)
        if key not in self._options:
            free = [g for g in range(self.n) if free_mask >> g & 1]
            out, order = [], []
            for c in itertools.combinations(free, k):
                cost = set_cost(self.weight, c)
                cheapest = k > 1 and cost <= self.minimum[k] + 1e-9
                crossings = sum(self.node[a] != self.node[b] for i, a in enumerate(c) for b in c[i + 1:])
                ordered = k > 1 and cost <= self.ordered[k][0] + 1e-9 and crossings <= self.ordered[k][1]
                out.append((bits(c), (int(cheapest), int(ordered))))
                order.append((cost, crossings))
            if self.cheapest_only:
                least_cost = min(cost for cost, _ in order)
                fewest = min(crossings for cost, crossings in order if cost <= least_cost + 1e-9)
                out = [option for option, (cost, crossings) in zip(out, order)
                       if cost <= least_cost + 1e-9 and crossings <= fewest]
            self._options[key] = out
        return self._options[key]

    def solve(self) -> int:
        """The transitions once; then the optimal policy per measure (self.values)."""
        self.transitions, self.start = self._transitions()
        self.values = [self._iterate(m) for m in range(len(METRICS))]
        return len(self.transitions)

    def _iterate(self, metric: int) -> dict:
        transitions, start = self.transitions, self.start
        value = dict.fromkeys(transitions, 0.0)
        for _ in range(ITERATIONS):
            updated = {s: sum(p * max(r[metric] + value[t] for t, r in actions) for p, actions in outcomes)
                       for s, outcomes in transitions.items()}
            change = [updated[s] - value[s] for s in transitions]
            value = {s: v - updated[start] for s, v in updated.items()}
            if max(change) - min(change) < TOLERANCE:
                break
        return value

    def _transitions(self) -> tuple[dict, tuple]:
        full = (1 << self.n) - 1
        start: tuple[int, ...] = ()
        transitions: dict[tuple, list[tuple[float, list[tuple[tuple, int]]]]] = {}
        frontier = [start]
        seen = {start}
        while frontier:
            state = frontier.pop()
            outcomes = []
            for ended in range(1 << len(state)):
                chance = 1.0
                kept = []
                for i, job in enumerate(state):
                    if ended >> i & 1:
                        chance *= END_PROBABILITY
                    else:
                        chance *= 1 - END_PROBABILITY
                        kept.append(job)
                busy = 0
                for job in kept:
                    busy |= job
                free = full & ~busy
                for k, share in self.sizes:
                    if bin(free).count("1") < k:
                        actions = [(self.canonical(kept), (0, 0))]
                    else:
                        actions = list(dict.fromkeys((self.canonical([*kept, chosen]), reward)
                                                     for chosen, reward in self.options(free, k)))
                    outcomes.append((chance * share, actions))
                    for nxt, _ in actions:
                        if nxt not in seen:
                            seen.add(nxt)
                            frontier.append(nxt)
            transitions[state] = outcomes
        return transitions, start

    def replay(self, seed: int, metric: int) -> tuple[float, float]:
        """bench/alloc.py's trace (same draws) under the measure's optimal policy: the share
        of multi-GPU grants that are best, and of multi-GPU requests."""
        value = self.values[metric]
        rng = random.Random(seed)
        running: list[tuple[int, int]] = []
        free = (1 << self.n) - 1
        best = multi = asked = 0
        for step in range(EVENTS):
            for entry in [r for r in running if r[0] <= step]:
                running.remove(entry)
                free |= entry[1]
            k = trace_bench._pick(rng, trace_bench.TRACE_MIX)
            duration = int(rng.expovariate(1 / 6.0)) + 1
            asked += k > 1
            if bin(free).count("1") < k:
                continue
            jobs = [job for _, job in running]
            chosen, reward = max(self.options(free, k),
                                 key=lambda option: option[1][metric] + value[self.canonical([*jobs, option[0]])])
            free &= ~chosen
            running.append((step + duration, chosen))
            if k > 1:
                multi += 1
                best += reward[metric]
        return (best / multi if multi else 0.0), (best / asked if asked else 0.0)


def main() -> int:
    started = time.perf_counter()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for name in HOSTS:
        ceiling = Ceiling(name)
        states = ceiling.solve()
        cheapest = Ceiling(name, cheapest_only=True)
        cheapest.solve()
        scores: dict[str, list] = {}
        for seed in SEEDS:
            for label, score in trace_bench.trace(name, EVENTS, seed, ceiling.loaded, refusing=True).items():
                scores.setdefault(label, []).append(score)
        mean = statistics.fmean
        print(f"{name}: {len(ceiling.symmetries)} symmetries, {states} states; seeds {SEEDS[0]}-{SEEDS[-1]}",
              flush=True)
        for metric, label in enumerate(METRICS):
            replays = [ceiling.replay(seed, metric) for seed in SEEDS]
            roof = mean(r[0] for r in replays)
            field = "at_best" if metric == 0 else "at_search_best"
            share = {who: mean(getattr(s, field) for s in runs) for who, runs in scores.items()}
            wins = sum(getattr(s, field) > r[0] + 1e-12 for s, r in zip(scores["topod"], replays))
            no_trade = mean(cheapest.replay(seed, metric)[0] for seed in SEEDS)
            print(f"  {name} best by {label}, grant at once: share of multi-GPU grants that are best: ceiling "
                  f"(optimal online policy) {roof:.1%}, topod level any {share['topod']:.1%} "
                  f"({(share['topod'] - roof) * 100:+.1f} points, {share['topod'] / roof:.1%} of the ceiling; "
                  f"above it on {wins} of {len(SEEDS)} streams), best-effort {share['best-effort']:.1%} "
                  f"({(share['best-effort'] - roof) * 100:+.1f}), first-fit {share['first-fit']:.1%}; the optimal policy "
                  f"choosing only among the cheapest free sets (no cost traded, as level any promises) {no_trade:.1%} "
                  f"(topod {(share['topod'] - no_trade) * 100:+.1f} points)", flush=True)
        runs = scores["topod-best"]
        per_request = mean(s.best_per_request for s in runs)
        roof_requests = mean(ceiling.replay(seed, 1)[1] for seed in SEEDS)
        any_requests = mean(s.best_per_request for s in scores["topod"])
        print(f"  {name} refusing policy, topod level best: {mean(s.at_search_best for s in runs):.1%} of its "
              f"multi-GPU grants best by search order (by cost {mean(s.at_best for s in runs):.1%}); "
              f"requests granted {mean(s.granted for s in runs):.1%} (level any "
              f"{mean(s.granted for s in scores['topod']):.1%}), refused with enough GPUs free "
              f"{mean(s.refused_with_room for s in runs):.0f} per stream; multi-GPU requests that got a best set: "
              f"level best {per_request:.1%}, level any {any_requests:.1%}, grant-at-once ceiling "
              f"{roof_requests:.1%} (not a bound for a refusing policy)", flush=True)
    print(f"bench wall time: {time.perf_counter() - started:.1f} s; load average at end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
