"""Link state: EWMA, median/MAD degradation with hysteresis, telemetry, corrections."""

from __future__ import annotations

import math

import pytest

from topod.probe.backend import LinkId, ProbeResult, ProbeSizes
from topod.probe.linkstate import LinkState, LinkStateSettings, TelemetryError

A, B, C = "0000:13:00.0", "0000:14:00.0", "0000:17:00.0"
AB = LinkId("p2p", A, B)
AC = LinkId("p2p", A, C)
H2D = LinkId("h2d", "node0", A)


def result(link, gbps, t=0.0):
    return ProbeResult(link, 2.0, gbps, ProbeSizes(), 0.01, 1000, t, "test")


def feed(state, link, values, start=0.0):
    events = []
    for i, value in enumerate(values):
        events += state.fold(result(link, value, start + i))
    return events


def test_one_slow_sample_does_not_degrade_a_link():
    state = LinkState([AB])
    assert feed(state, AB, [25.0, 25.2, 24.9, 25.1, 6.0, 25.0, 25.1]) == []
    assert state.degraded() == [] and state.corrections() == {}


def test_sustained_drop_emits_link_degraded_then_recovered():
    state = LinkState([AB])
    events = feed(state, AB, [25.0, 25.2, 24.9, 25.1, 6.0, 6.1])
    assert [e.event for e in events] == ["link_degraded"]
    assert events[0].fields()["ratio"] == pytest.approx(6.05 / 25.05, abs=0.01)
    assert state.degraded() == [AB]
    events = feed(state, AB, [24.8, 25.0], start=10)
    assert [e.event for e in events] == ["link_recovered"]
    assert state.degraded() == [] and state.corrections() == {}


def test_a_mild_dip_inside_the_ratio_is_not_a_degradation():
    state = LinkState([AB])
    # Clear outliers statistically (noise-free history), but still 80% of healthy.
    assert feed(state, AB, [25.0, 25.0, 25.0, 25.0, 20.0, 20.0, 20.0]) == []


def test_correction_is_capped_at_max_factor():
    state = LinkState([AC], LinkStateSettings(max_factor=3.0))
    feed(state, AC, [25.0, 25.0, 25.0, 1.0, 1.0])
    assert state.corrections() == {(A, C): 3.0}


def test_degraded_pair_gets_a_distance_correction_and_others_do_not():
    state = LinkState([AB, AC, H2D])
    for link in (AB, AC, H2D):
        feed(state, link, [25.0, 25.1, 24.9])
    feed(state, AC, [10.0, 10.0, 10.0])
    feed(state, H2D, [3.0, 3.0, 3.0])  # host links have no DistanceModel pair
    corrections = state.corrections()
    assert set(corrections) == {(A, C)}
    assert corrections[(A, C)] == pytest.approx(25.0 / 10.0, rel=0.01)


def test_correction_grows_as_the_link_keeps_degrading():
    state = LinkState([AC])
    feed(state, AC, [25.0, 25.0, 25.0, 12.0, 12.0])
    first = state.corrections()[(A, C)]
    assert first == pytest.approx(25.0 / 12.0, rel=0.01)
    feed(state, AC, [8.0, 8.0], start=10)
    assert state.corrections()[(A, C)] == pytest.approx(25.0 / 8.0, rel=0.01)


def test_cycle_is_stable_only_when_every_link_stays_near_its_ewma():
    state = LinkState([AB, AC])
    assert not state.fold_cycle([result(AB, 25.0), result(AC, 25.0)]).stable  # nothing known yet
    assert state.fold_cycle([result(AB, 25.5), result(AC, 24.6)]).stable
    assert not state.fold_cycle([result(AB, 25.0), result(AC, 18.0)]).stable


def test_telemetry_from_jobs_is_folded_by_gpu_index():
    state = LinkState([AB])
    outcome = state.telemetry("p2p/gpu0/gpu1", 2_500_000_000, 0.1, now=5.0, gpu_addresses={0: A, 1: B})
    assert outcome.folded and outcome.bandwidth_gbps == pytest.approx(25.0)
    (row,) = state.rows(now=7.0)
    assert (row["telemetry_samples"], row["probe_samples"], row["age_s"]) == (1, 0, 2.0)


def test_small_telemetry_transfers_are_counted_but_not_folded():
    state = LinkState([AB])
    outcome = state.telemetry(str(AB), 4096, 0.00001, now=0.0)
    assert not outcome.folded and "latency, not bandwidth" in outcome.reason
    (row,) = state.rows(now=0.0)
    assert row["measured_gbps"] is None and row["ignored_small_reports"] == 1


@pytest.mark.parametrize("link, nbytes, seconds, words", [
    (str(AB), -5, 1.0, "bytes must be a positive integer, got -5"),
    (str(AB), 0, 1.0, "bytes must be a positive integer, got 0"),
    (str(AB), 1.5e9 + 0.5, 1.0, "bytes must be a positive integer"),  # 1.5e9 itself is an integer
    (str(AB), True, 1.0, "bytes must be a positive integer"),
    (str(AB), 10**9, 0, "seconds must be a positive finite number, got 0"),
    (str(AB), 10**9, -1.0, "seconds must be a positive finite number"),
    (str(AB), 10**9, math.nan, "seconds must be a positive finite number"),
    (str(AB), 10**9, "1", "seconds must be a positive finite number"),
    (str(AC), 10**9, 1.0, "unknown link 'p2p/0000:13:00.0/0000:17:00.0'"),
    ("p2p/gpu0", 10**9, 1.0, "expected kind/src/dst"),
    (None, 10**9, 1.0, "link must be a string"),
    (str(AB), 10**15, 0.001, "above the plausible"),
])
def test_bad_telemetry_gets_a_clear_error(link, nbytes, seconds, words):
    state = LinkState([AB])
    with pytest.raises(TelemetryError, match=words) as info:
        state.telemetry(link, nbytes, seconds, now=0.0)
    assert info.value.code == "invalid_telemetry"
    assert state.rows(now=0.0)[0]["telemetry_samples"] == 0


def test_a_telemetry_body_is_folded_like_its_fields():
    state = LinkState([AB])
    outcome = state.telemetry_body({"link": str(AB), "bytes": 2 * 10**9, "seconds": 0.1}, now=1.0)
    assert outcome.folded and outcome.bandwidth_gbps == pytest.approx(20.0)


@pytest.mark.parametrize("body, words", [
    ([], "expected a JSON object"),
    ({"link": str(AB), "bytes": 10**9}, "missing seconds"),
    ({"link": str(AB), "bytes": 10**9, "seconds": 1.0, "gpu": 0}, "unknown gpu"),
])
def test_a_malformed_telemetry_body_names_the_fields(body, words):
    with pytest.raises(TelemetryError, match=words):
        LinkState([AB]).telemetry_body(body, now=0.0)


def test_register_keeps_history_of_links_that_remain():
    state = LinkState([AB, AC])
    feed(state, AB, [25.0])
    state.register([AB])
    assert state.links == [AB] and state.rows(0.0)[0]["probe_samples"] == 1
    state.reset()
    assert state.rows(0.0)[0]["probe_samples"] == 0


@pytest.mark.parametrize("kwargs", [{"ewma_alpha": 0}, {"degraded_ratio": 0.9, "recovered_ratio": 0.8},
                                    {"window": 2, "min_samples": 3}])
def test_inconsistent_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        LinkStateSettings(**kwargs)
