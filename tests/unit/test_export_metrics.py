"""Prometheus exposition from a daemon snapshot: names, values, and promtool's verdict."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest

from topod.export.metrics import DEFAULT_BUCKETS, LatencyHistogram, render_metrics


def full_snapshot() -> dict:
    latency = LatencyHistogram()
    for seconds in (0.000008, 0.00004, 0.0003, 0.001, 0.003, 2.0):
        latency.observe(seconds)
    return {
        "build": {"version": "0.1.0", "python": "3.11"},
        "gpus_by_state": {"free": 6, "leased": 2},
        "nics_by_state": {"free": 5, "leased": 2, "down": 1},
        "leases": [{"id": "l-1", "gpus": 2, "satisfaction": 1.0}, {"id": "l-2", "gpus": 1}],
        "gpu_leased": {0: 1, 1: 1, 2: 0},
        "decision_latency": latency.to_snapshot(),
        "requests": [{"result": "granted", "reason": "", "count": 9},
                     {"result": "denied", "reason": "not_in_group", "count": 1},
                     {"result": "rejected", "reason": "insufficient_gpus", "count": 2}],
        "irq_moves": 42,
        "cpu_interrupt_rates": {1: 3.5, 0: 1200.0},
        "link_bandwidth": [{"src": "GPU0", "dst": "GPU1", "bytes_per_second": 2.1e10}],
        "probe": {"duration_seconds": 0.8, "last_timestamp_seconds": 1.7e9},
    }


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_every_section_becomes_its_metrics():
    values = samples(render_metrics(full_snapshot()))
    assert values['topod_build_info{python="3.11",version="0.1.0"}'] == 1
    assert values['topod_gpus{state="leased"}'] == 2
    assert values['topod_nics{state="free"}'] == 5
    assert values['topod_nics{state="leased"}'] == 2
    assert values['topod_nics{state="down"}'] == 1
    assert values["topod_leases_active"] == 2
    assert not [name for name in values if "lease=" in name], "no series per lease id"
    assert [values[f'topod_gpu_leased{{gpu="{g}"}}'] for g in range(3)] == [1, 1, 0]
    assert values["topod_lease_topology_satisfaction_min_ratio"] == 1.0
    assert values['topod_allocation_requests_total{reason="not_in_group",result="denied"}'] == 1
    assert values['topod_allocation_requests_total{reason="insufficient_gpus",result="rejected"}'] == 2
    assert values['topod_allocation_requests_total{reason="",result="granted"}'] == 9
    assert values["topod_irq_moves_total"] == 42
    assert values['topod_cpu_interrupts_per_second{cpu="0"}'] == 1200.0
    assert values['topod_link_bandwidth_bytes_per_second{dst="GPU1",src="GPU0"}'] == 2.1e10
    assert values["topod_probe_duration_seconds"] == 0.8


def test_latency_histogram_is_cumulative_with_inf_bucket():
    values = samples(render_metrics({"decision_latency": full_snapshot()["decision_latency"]}))
    assert values['topod_allocation_decision_seconds_bucket{le="1e-05"}'] == 1
    assert values['topod_allocation_decision_seconds_bucket{le="2.5e-05"}'] == 1
    assert values['topod_allocation_decision_seconds_bucket{le="5e-05"}'] == 2
    assert values['topod_allocation_decision_seconds_bucket{le="0.00025"}'] == 2
    assert values['topod_allocation_decision_seconds_bucket{le="0.0005"}'] == 3
    assert values['topod_allocation_decision_seconds_bucket{le="0.001"}'] == 4  # le: 0.001 itself counts
    assert values['topod_allocation_decision_seconds_bucket{le="1.0"}'] == 5
    assert values['topod_allocation_decision_seconds_bucket{le="+Inf"}'] == 6
    assert values["topod_allocation_decision_seconds_count"] == 6
    assert math.isclose(values["topod_allocation_decision_seconds_sum"], 2.004348)


def test_decision_buckets_start_at_ten_microseconds_and_resolve_typical_decisions():
    text = render_metrics({"decision_latency": LatencyHistogram().to_snapshot()})
    bounds = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("topod_allocation_decision_seconds_bucket")]
    assert bounds == ["1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
                      "0.01", "0.025", "0.1", "1.0", "+Inf"]
    assert DEFAULT_BUCKETS[0] == 1e-05
    # Decisions take 0.05-0.3 ms: that range spans several buckets, not the inside of one.
    assert sum(0.00005 <= bound <= 0.0003 for bound in DEFAULT_BUCKETS) >= 3
    histogram = LatencyHistogram()
    for seconds in (0.00006, 0.00012, 0.0002, 0.00028):
        histogram.observe(seconds)
    assert sum(1 for count in histogram.counts if count) == 3  # spread, not one lump


@pytest.mark.parametrize("form,value", [
    ("requests", [{"result": "granted", "reason": "", "count": 9},
                  {"result": "rejected", "reason": "insufficient_gpus", "count": 2}]),
    ("requests", [{"result": "granted", "count": 9},  # reason may be left out: ""
                  {"result": "rejected", "reason": "insufficient_gpus", "count": 2}]),
    ("requests_by_result_reason", {("granted", ""): 9, ("rejected", "insufficient_gpus"): 2}),
])
def test_requests_carry_result_and_reason_in_every_form(form, value):
    values = samples(render_metrics({form: value}))
    assert values == {'topod_allocation_requests_total{reason="",result="granted"}': 9,
                      'topod_allocation_requests_total{reason="insufficient_gpus",result="rejected"}': 2}


def test_richest_form_wins_when_a_daemon_sends_several_that_agree():
    text = render_metrics({
        "requests": [{"result": "granted", "reason": "best", "count": 7}, {"result": "granted", "reason": "good",
                                                                            "count": 2},
                     {"result": "rejected", "reason": "insufficient_gpus", "count": 1}],
        "requests_by_result": {"granted": 9, "rejected": 1},
    })
    assert samples(text) == {'topod_allocation_requests_total{reason="best",result="granted"}': 7,
                             'topod_allocation_requests_total{reason="good",result="granted"}': 2,
                             'topod_allocation_requests_total{reason="insufficient_gpus",result="rejected"}': 1}
    assert text.count("# TYPE topod_allocation_requests_total counter") == 1


def test_old_requests_by_result_still_renders_with_an_empty_reason():
    values = samples(render_metrics({"requests_by_result": {"granted": 9, "denied": 1}}))
    assert values == {'topod_allocation_requests_total{reason="",result="denied"}': 1,
                      'topod_allocation_requests_total{reason="",result="granted"}': 9}


def test_missing_sections_are_left_out_not_zeroed():
    text = render_metrics({"irq_moves": 0})
    assert "topod_irq_moves_total 0.0" in text
    assert "topod_gpus" not in text and "topod_probe" not in text


def test_renders_are_independent_no_global_registry():
    render_metrics({"irq_moves": 5})
    assert "irq_moves" not in render_metrics({"gpus_by_state": {"free": 1}})


@pytest.mark.parametrize("snapshot,fragment", [
    ({"gpu_states": {}}, "unknown sections"),
    ({"irq_moves": "many"}, "irq_moves must be a number"),
    ({"gpus_by_state": {"free": True}}, "gpus_by_state.free"),
    ({"nics_by_state": {"down": "1"}}, "nics_by_state.down"),
    ({"leases": [{"id": "l-1", "gpus": 1, "satisfaction": 1.5}]}, "outside 0..1"),
    ({"decision_latency": {"buckets": {0.1: 2}, "sum": 0.1, "count": 3}}, "count 3 != bucket total 2"),
    ({"requests": [{"result": "rejected", "reason": "no GPU free on node 0", "count": 1}]}, "snake_case code"),
    ({"requests": [{"result": "granted", "reason": "best", "count": 1}], "requests_by_result": {"granted": 2}},
     "requests and requests_by_result disagree"),
    ({"requests": [{"result": "granted", "count": 1}, {"result": "granted", "reason": "", "count": 2}]},
     "given twice"),
    ({"requests": [{"result": "granted", "count": -1}]}, "negative"),
    ({"requests": [{"result": "granted", "why": "x", "count": 1}]}, "result, reason, count"),
    ({"requests": [{"result": "", "count": 1}]}, "non-empty string"),
    ({"requests_by_result_reason": {"granted": 1}}, r"must be \(result, reason\)"),
])
def test_bad_snapshot_is_rejected_naming_the_field(snapshot, fragment):
    with pytest.raises(ValueError, match=fragment):
        render_metrics(snapshot)


def test_histogram_bounds_must_increase():
    with pytest.raises(ValueError, match="increasing"):
        LatencyHistogram(bounds=(0.1, 0.01))


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_metrics_accepts_the_output():
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=render_metrics(full_snapshot()),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_would_catch_a_broken_exposition():
    broken = "# TYPE topod_x counter\ntopod_x 1\n"  # a counter without _total: promtool lints it
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=broken, capture_output=True, text=True, timeout=60)
    assert (result.stdout + result.stderr).strip() != ""


def test_lease_series_stay_bounded_however_many_leases_come_and_go():
    """A thousand leases granted over time give the same series as two: per GPU and
    totals, never a series per lease id (each would live on in Prometheus)."""
    def names(leases: list[dict]) -> set[str]:
        snapshot = {"leases": leases, "gpu_leased": {0: 1, 1: 0}}
        return {name.split(" ")[0] for name in render_metrics(snapshot).splitlines() if not name.startswith("#")}

    few = names([{"id": f"l-{n}", "gpus": 1, "cpus": 4, "satisfaction": 1.0} for n in range(2)])
    many = names([{"id": f"l-{n}", "gpus": 1, "cpus": 4, "satisfaction": 0.5} for n in range(1000)])
    assert few == many


def test_a_gpu_leased_flag_other_than_0_or_1_is_refused():
    with pytest.raises(ValueError, match="gpu_leased.3 must be 0 or 1"):
        render_metrics({"gpu_leased": {3: 2}})
