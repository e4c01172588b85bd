"""The engine's per-decision computations that have shortcuts (phi per group kind, counted
by bit masks) give the values the plain per-GPU formula gives, to the bit, on seeded
random busy sets: a decision that has to be computed picks what it picked before."""

from __future__ import annotations

import random

import pytest

from topod.alloc.engine import _group_index, _group_kinds, _phi_of
from topod.alloc.hostview import host_view


def _phi_per_gpu(view, busy: set[int]) -> list[float]:
    """The packing phi by its definition, one GPU at a time (the formula the engine had)."""
    members, sizes = _group_index(view)
    free_in = list(sizes)
    for p in busy:
        for i in members[p]:
            free_in[i] -= 1
    share = [count / size for count, size in zip(free_in, sizes)]
    return [sum(share[i] for i in groups) / len(groups) if groups else 1.0 for groups in members]


@pytest.mark.parametrize("name", ["h800-8gpu", "pcie-8gpu", "nps4-8gpu", "dgx1-cubemesh", "pcie-16gpu",
                                  "nvs-16gpu", "pcie-64gpu"])
def test_phi_equals_the_per_gpu_formula_on_random_busy_sets(host, name):
    topology, distances = host(name)
    view = host_view(topology, distances)
    rng = random.Random(26)
    for step in range(200):
        busy = set(rng.sample(range(view.n), rng.randrange(view.n + 1)))
        view.cache.get("phi", {}).clear()  # computed now, not remembered
        if step % 2:
            for known in _group_kinds(view)[4]:
                known.clear()  # every kind's phi computed now too (else some are the memo's)
        assert _phi_of(view, busy) == _phi_per_gpu(view, busy)
