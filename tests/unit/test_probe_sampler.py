"""The adaptive probe schedule: back-off, resets, budget, leased GPUs."""

from __future__ import annotations

import pytest

from topod.probe.backend import LinkId
from topod.probe.sampler import Sampler, SamplerSettings

GPU0, GPU1 = "0000:13:00.0", "0000:14:00.0"
LINKS = [LinkId("mem", "node0", "node0"), LinkId("h2d", "node0", GPU0), LinkId("d2h", GPU1, "node0"),
         LinkId("p2p", GPU0, GPU1)]


def settled(cycles=3, cost=0.01):
    sampler = Sampler(SamplerSettings(), started=0.0)
    now = 0.0
    for _ in range(cycles):
        now = sampler.due_at()
        sampler.record(cost, 1000, stable=True, now=now + cost)
    return sampler, now + cost


def test_first_probe_is_due_at_start():
    sampler = Sampler(SamplerSettings(), started=100.0)
    assert sampler.due(100.0) and sampler.seconds_until_due(100.0) == 0.0


def test_stable_results_double_the_interval_up_to_the_maximum():
    sampler = Sampler(SamplerSettings(min_interval_s=30, max_interval_s=200), started=0.0)
    intervals = [sampler.record(0.01, 10, stable=True, now=float(i)) for i in range(5)]
    assert intervals == [60.0, 120.0, 200.0, 200.0, 200.0]


def test_a_deviation_drops_the_interval_to_the_minimum():
    sampler, now = settled()
    assert sampler.interval == 240.0
    assert sampler.record(0.01, 10, stable=False, now=now) == 30.0
    assert sampler.last_reason == "deviation"


def test_a_lease_change_resets_the_interval_and_brings_the_next_probe_forward():
    sampler, now = settled()
    assert sampler.seconds_until_due(now) == pytest.approx(240.0)
    sampler.on_lease_change(now + 5.0)
    assert sampler.interval == 30.0 and sampler.last_reason == "lease_change"
    assert sampler.seconds_until_due(now + 5.0) == pytest.approx(25.0)
    sampler.on_topology_change(now + 100.0)  # long after: due at once
    assert sampler.due(now + 100.0) and sampler.last_reason == "topology_change"


def test_an_expensive_cycle_stretches_the_interval_to_fit_the_budget():
    sampler = Sampler(SamplerSettings(min_interval_s=30, budget_share=0.01), started=0.0)
    assert sampler.record(2.0, 10, stable=False, now=2.0) == pytest.approx(200.0)  # 2 s / 1 %
    sampler.on_lease_change(10.0)
    assert sampler.interval == pytest.approx(200.0)


def test_probe_time_never_exceeds_the_budget_share_even_with_constant_resets():
    settings = SamplerSettings(min_interval_s=1.0, budget_share=0.01)
    sampler = Sampler(settings, started=0.0)
    now = 0.0
    for _ in range(200):
        now = max(now, sampler.due_at())
        assert sampler.share(now) <= settings.budget_share + 1e-9  # checked as each cycle starts
        sampler.record(0.5, 10, stable=False, now=now + 0.5)
        now += 0.5
        sampler.on_lease_change(now)  # a lease churn storm asks for probes all the time
    assert now >= 200 * 0.5 / settings.budget_share - 0.5 / settings.budget_share


def test_links_of_leased_gpus_are_skipped_unless_allowed():
    plan = Sampler(SamplerSettings(), started=0.0).plan(LINKS, leased_devices=[GPU0])
    assert plan.links == (LINKS[0], LINKS[2])
    assert [link for link, _ in plan.skipped] == [LINKS[1], LINKS[3]]
    assert "0000:13:00.0 held by a lease" in plan.skipped[0][1]
    allowed = Sampler(SamplerSettings(probe_leased_gpus=True), started=0.0).plan(LINKS, leased_devices=[GPU0])
    assert allowed.links == tuple(LINKS) and allowed.skipped == ()


def test_a_disabled_sampler_is_never_due():
    sampler = Sampler(SamplerSettings(enabled=False), started=0.0)
    assert not sampler.due(1e9)


def test_status_reports_interval_share_and_cost():
    sampler, now = settled(cycles=2, cost=0.3)
    status = sampler.to_json(now)
    assert status["cycles"] == 2 and status["probe_seconds"] == pytest.approx(0.6)
    assert status["interval_s"] == 120.0 and 0 < status["share_of_wall_time"] <= 0.01 + 1e-9


@pytest.mark.parametrize("kwargs, words", [
    ({"min_interval_s": 0}, "min_interval"),
    ({"min_interval_s": 100, "max_interval_s": 10}, "min_interval"),
    ({"budget_share": 0}, "budget_share"),
    ({"budget_share": 1.5}, "budget_share"),
    ({"backoff": 0.5}, "backoff"),
])
def test_bad_sampler_settings_are_rejected(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplerSettings(**kwargs)
