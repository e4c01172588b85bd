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
that pay cost now to keep sets for later); reward 1 when a grant of k >= 2 costs the
empty host's minimum for k. Relative value iteration gives the optimal policy; it is
replayed on the seeds bench/alloc.py uses. An allocator that does not know the future
cannot beat this policy in expectation; on one stream it can, by luck, by a little.
"""

from __future__ import annotations

import itertools
import math
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


class Ceiling:
    def __init__(self, name: str) -> None:
        self.loaded = trace_bench.load(name)
        topology, distances = self.loaded
        view = host_view(topology, distances)
        self.n = n = view.n
        self.weight = view.weight
        self.minimum = trace_bench.exhaustive_minima(self.weight, list(range(n)))
        self.symmetries = [p for p in itertools.permutations(range(n))
                           if all(abs(self.weight[a][b] - self.weight[p[a]][p[b]]) < 1e-9
                                  for a in range(n) for b in range(a + 1, n))]
        self.relabel = [[bits(p[g] for g in range(n) if mask >> g & 1) for mask in range(1 << n)]
                        for p in self.symmetries]
        total = sum(w for _, w in trace_bench.TRACE_MIX)
        self.sizes = [(k, w / total) for k, w in trace_bench.TRACE_MIX]
        self._options: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def canonical(self, jobs) -> tuple[int, ...]:
        return min(tuple(sorted(table[j] for j in jobs)) for table in self.relabel)

    def options(self, free_mask: int, k: int) -> list[tuple[int, int]]:
        """(the k-set as a mask, 1 if it costs the host minimum and k >= 2) for every k-set."""
        key = (free_mask, k)
        if key not in self._options:
            free = [g for g in range(self.n) if free_mask >> g & 1]
            self._options[key] = [(bits(c), int(k > 1 and set_cost(self.weight, c) <= self.minimum[k] + 1e-9))
                                  for c in itertools.combinations(free, k)]
        return self._options[key]

    def solve(self) -> tuple[int, float]:
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
                        actions = [(self.canonical(kept), 0)]
                    else:
                        actions = list(dict.fromkeys((self.canonical([*kept, chosen]), reward)
                                                     for chosen, reward in self.options(free, k)))
                    outcomes.append((chance * share, actions))
                    for nxt, _ in actions:
                        if nxt not in seen:
                            seen.add(nxt)
                            frontier.append(nxt)
            transitions[state] = outcomes
        value = dict.fromkeys(transitions, 0.0)
        gain = 0.0
        for _ in range(ITERATIONS):
            updated = {s: sum(p * max(r + value[t] for t, r in actions) for p, actions in outcomes)
                       for s, outcomes in transitions.items()}
            gain = updated[start] - value[start]
            change = [updated[s] - value[s] for s in transitions]
            value = {s: v - updated[start] for s, v in updated.items()}
            if max(change) - min(change) < TOLERANCE:
                break
        self.value = value
        return len(transitions), gain

    def replay(self, seed: int) -> float:
        """bench/alloc.py's trace (same draws) under the optimal policy: share at the minimum."""
        rng = random.Random(seed)
        running: list[tuple[int, int]] = []
        free = (1 << self.n) - 1
        best = multi = 0
        for step in range(EVENTS):
            for entry in [r for r in running if r[0] <= step]:
                running.remove(entry)
                free |= entry[1]
            k = trace_bench._pick(rng, trace_bench.TRACE_MIX)
            duration = int(rng.expovariate(1 / 6.0)) + 1
            if bin(free).count("1") < k:
                continue
            jobs = [job for _, job in running]
            chosen, reward = max(self.options(free, k),
                                 key=lambda option: option[1] + self.value[self.canonical([*jobs, option[0]])])
            free &= ~chosen
            running.append((step + duration, chosen))
            if k > 1:
                multi += 1
                best += reward
        return best / multi if multi else 0.0


def main() -> int:
    started = time.perf_counter()
    for name in HOSTS:
        ceiling = Ceiling(name)
        states, gain = ceiling.solve()
        optimal = [ceiling.replay(seed) for seed in SEEDS]
        others: dict[str, list[float]] = {}
        for seed in SEEDS:
            for label, score in trace_bench.trace(name, EVENTS, seed, ceiling.loaded).items():
                others.setdefault(label, []).append(score.at_best)
        ceiling_mean = statistics.fmean(optimal)
        topod, best_effort = statistics.fmean(others["topod"]), statistics.fmean(others["best-effort"])
        print(f"{name}: {len(ceiling.symmetries)} symmetries, {states} states; over seeds {SEEDS[0]}-{SEEDS[-1]}, "
              f"share of multi-GPU grants at the exhaustive minimum: optimal online policy {ceiling_mean:.1%}, "
              f"topod {topod:.1%}, best-effort {best_effort:.1%}; ceiling over best-effort "
              f"{(ceiling_mean - best_effort) * 100:+.1f} points, topod over best-effort "
              f"{(topod - best_effort) * 100:+.1f}; topod reaches {topod / ceiling_mean:.1%} of the ceiling",
              flush=True)
    print(f"bench wall time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
