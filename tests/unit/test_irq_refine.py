"""Load-aware refinement with hysteresis (pure)."""

from __future__ import annotations

import random

from topod.irq.refine import imbalance, refine

ORDER = (0, 1, 2, 3)


def _run(assignment, weights, cooling=frozenset(), min_gain=0.2, background=None):
    return refine(assignment, {ORDER: sorted(assignment)}, weights, background or {}, cooling, min_gain)


def test_two_hot_irqs_on_one_cpu_are_separated_by_a_swap_keeping_counts():
    assignment = {10: 0, 11: 0, 12: 1, 13: 1, 14: 2, 15: 2, 16: 3, 17: 3}
    weights = dict.fromkeys(assignment, 1.0) | {10: 100.0, 11: 100.0}
    placed, moved = _run(assignment, weights)
    assert placed[10] != placed[11]
    counts = [list(placed.values()).count(cpu) for cpu in ORDER]
    assert counts == [2, 2, 2, 2]
    assert moved and all("load: CPU 0 carried" in why for why in moved.values())


def test_a_move_goes_from_a_cpu_with_one_more_irq_to_one_with_one_fewer():
    assignment = {10: 0, 11: 0, 12: 1, 13: 2, 14: 3}
    weights = {10: 50.0, 11: 50.0, 12: 1.0, 13: 1.0, 14: 1.0}
    placed, _ = _run(assignment, weights)
    assert sorted(list(placed.values()).count(cpu) for cpu in ORDER) == [1, 1, 1, 2]
    assert placed[10] != placed[11]


def test_a_gain_below_min_gain_moves_nothing():
    assignment = {10: 0, 11: 1, 12: 2, 13: 3}
    weights = {10: 11.0, 11: 10.0, 12: 10.0, 13: 10.0}
    assert _run(assignment, weights)[1] == {}


def test_one_hot_irq_alone_on_its_cpu_is_not_moved_pointlessly():
    assignment = {10: 0, 11: 1, 12: 2, 13: 3}
    assert _run(assignment, {10: 1000.0, 11: 1.0, 12: 1.0, 13: 1.0})[1] == {}


def test_irqs_in_cooldown_are_not_moved_for_load():
    assignment = {10: 0, 11: 0, 12: 1, 13: 1}
    weights = {10: 100.0, 11: 100.0, 12: 1.0, 13: 1.0}
    assert _run(assignment, weights, cooling=frozenset({10, 11}))[1] == {}


def test_steady_noisy_load_converges_then_never_flaps():
    noise = random.Random(3)
    assignment = {irq: irq % 4 for irq in range(12)}
    base = {irq: (50.0 if irq in (0, 4, 8) else 5.0) for irq in range(12)}  # three hot IRQs all on CPU 0
    moves_per_cycle = []
    for _ in range(20):
        weights = {irq: w * noise.uniform(0.95, 1.05) for irq, w in base.items()}
        placed, moved = _run(assignment, weights)
        moves_per_cycle.append(sum(placed[i] != assignment[i] for i in placed))
        assignment = placed
    assert moves_per_cycle[0] > 0
    assert moves_per_cycle[3:] == [0] * 17
    assert len({assignment[0], assignment[4], assignment[8]}) == 3


def test_background_load_counts_against_a_cpu():
    assignment = {10: 0, 11: 1}
    weights = {10: 60.0, 11: 1.0}
    assert refine(assignment, {(0, 1): [10, 11]}, weights, {}, frozenset(), 0.2)[0] == assignment
    placed, _ = refine(assignment, {(0, 1): [10, 11]}, weights, {0: 50.0}, frozenset(), 0.2)
    assert placed == {10: 1, 11: 0}


def test_imbalance_is_max_over_mean_and_none_without_load():
    groups = {ORDER: [10, 11]}
    assert imbalance({10: 0, 11: 0}, {10: 1.0, 11: 1.0}, {}, groups) == 4.0
    assert imbalance({10: 0, 11: 1}, {}, {}, groups) is None
