"""Baselines for bench/alloc.py: first-fit, and NVIDIA go-gpuallocator's best-effort policy
re-implemented in Python from its documented algorithm (gpuallocator/besteffort_policy.go):

- pair score = the PCIe common-ancestor score (same board 60, single switch 50, multiple
  switches 40, host bridge 30, same CPU 20, cross CPU 10) + 100 per direct NVLink link,
  counted from NVML's per-link remote device (a link to an NVSwitch has a switch as its
  remote, so NVSwitch systems score no NVLink at all); link counts above twelve add
  nothing (its switch statement stops at TwelveNVLINKLinks);
- set score = sum of its pair scores;
- allocation: pad the available GPUs to a multiple of `size`, enumerate every partition
  into sets of `size` (padding all in one set), keep the partition with the highest total
  score among those with a padding-free set holding all required GPUs, then return that
  partition's highest-scoring such set. size 1 returns the first available GPU.
"""

from __future__ import annotations

import time
from itertools import combinations
from math import comb, factorial

from topod.distance import pcie_distance
from topod.model import Topology

PCIE_SCORE = {"X": 60, "PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}
NVLINK_POINTS = 100
MAX_SCORED_LINKS = 12


def pair_scores(topology: Topology) -> dict[tuple[int, int], int]:
    devices = {gpu.index: topology.device(gpu.address) for gpu in topology.gpus}
    scores: dict[tuple[int, int], int] = {}
    for a in topology.gpus:
        for b in topology.gpus:
            if a.index == b.index:
                continue
            da, db = devices[a.index], devices[b.index]
            level = pcie_distance(topology, da, db).level if da and db else "SYS"
            links = topology.nvlink.links_between(a.index, b.index)  # direct GPU-GPU links only
            scores[a.index, b.index] = PCIE_SCORE[level] + (NVLINK_POINTS * links if links <= MAX_SCORED_LINKS else 0)
    return scores


class Deadline(Exception):
    pass


class BestEffort:
    def __init__(self, topology: Topology) -> None:
        self.score = pair_scores(topology)
        self.partitions = 0

    def set_score(self, members) -> int:
        real = [g for g in members if g is not None]
        return sum(self.score[a, b] for i, a in enumerate(real) for b in real[i + 1:])

    def allocate(self, available: list[int], required: list[int], size: int,
                 deadline: float | None = None) -> list[int]:
        if size <= 0 or len(available) < size or len(required) > size:
            return []
        if size == 1:
            candidates = [[[g]] for g in available]
            best_partition = next((p for p in candidates if _has_all(p, required)), None)
        else:
            best_partition, best = None, 0
            for partition in self._partitions(available, size, deadline):
                if not _has_all(partition, required):
                    continue
                total = sum(self.set_score(s) for s in partition)
                if total > best or best_partition is None:
                    best_partition, best = partition, total
        if best_partition is None:
            return []
        sets = [s for s in best_partition if all(r in s for r in required)]
        if not sets:
            return []
        chosen = max(sets, key=self.set_score)  # first of the highest, like the Go loop
        return sorted(chosen)

    def _partitions(self, devices: list[int], size: int, deadline: float | None):
        padded: list[int | None] = list(devices)
        while len(padded) % size:
            padded.append(None)
        padding = len(padded) - len(devices)

        def iterate(pool: list, accum: list):
            if len(pool) == size:
                self.partitions += 1
                if deadline is not None and self.partitions % 256 == 0 and time.perf_counter() > deadline:
                    raise Deadline
                yield accum + [pool]
                return
            head = pool[0]
            for rest in combinations(pool[1:], size - 1):
                chosen = (head, *rest)
                pads = sum(1 for g in chosen if g is None)
                if not (pads == 0 or pads == padding):
                    continue
                remaining = [g for g in pool if g not in chosen] if pads == 0 else \
                    [g for g in pool if g is not None and g not in chosen]
                yield from iterate(remaining, accum + [list(chosen)])

        yield from iterate(padded, [])


def _has_all(partition, required) -> bool:
    return any(all(r in s for r in required) and None not in s for s in partition)


def partition_count(n: int, size: int) -> int:
    """How many partitions BestEffort enumerates for n available GPUs."""
    if size <= 1:
        return n
    pad = (-n) % size
    if pad == 0:
        groups = n // size
        return factorial(n) // (factorial(size) ** groups * factorial(groups))
    rest = n - (size - pad)
    groups = rest // size
    return comb(n, size - pad) * factorial(rest) // (factorial(size) ** groups * factorial(groups))


def first_fit(available: list[int], size: int) -> list[int]:
    return sorted(available)[:size] if len(available) >= size else []
