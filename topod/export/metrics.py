"""Prometheus exposition text from a snapshot of the daemon's state.

The daemon owns the numbers; this module only turns one snapshot dict into text, with a
fresh CollectorRegistry per render, so there is no global state and no metric can go
stale between scrapes. Every section of the snapshot is optional: a missing section
means its metrics are left out (never reported as zero); an unknown key is an error.
The snapshot's keys:

    {
      "build": {"version": "0.1.0"},                        # topod_build_info
      "gpus_by_state": {"free": 6, "leased": 2},            # topod_gpus{state}
      "nics_by_state": {"free": 5, "leased": 2, "down": 1}, # topod_nics{state}: RDMA NIC ports
      "leases": [{"id": "l-1", "gpus": 2, "cpus": 8, "satisfaction": 1.0}],  # cpus: optional
      "gpu_leased": {0: 1, 1: 1, 2: 0},                     # topod_gpu_leased{gpu}
      "decision_latency": {"buckets": {1e-05: 0, 0.0001: 3, 0.001: 9}, "sum": 0.004, "count": 12},
      "requests": [                                          # topod_allocation_requests_total{result,reason}
        {"result": "granted", "reason": "", "count": 9},     # counters, since start
        {"result": "rejected", "reason": "insufficient_gpus", "count": 2},
      ],
      "irq_moves": 42,                                       # counter, since start
      "cpu_interrupt_rates": {0: 1200.0, 1: 3.5},            # per second, last cycle
      "link_bandwidth": [{"src": "GPU0", "dst": "GPU1", "bytes_per_second": 2.1e10}],
      "probe": {"duration_seconds": 0.8, "last_timestamp_seconds": 1.7e9},
      "nvlink_domain": {"cluster_uuid": "5a1b...", "clique_ids": [32766]},  # topology JSON's; info
      "gpu_caps": [{"scope": "uid", "group": "", "cap": 4},  # topod_gpu_cap{scope,group}: the
                   {"scope": "group", "group": "physics", "cap": 8}],  # configured caps only
    }

GPU caps are the configured ones ([alloc] max_gpus_per_uid, max_gpus_per_group), one series
per cap, so the count of series is the config's; what a uid holds is not exported (a
series per uid would grow without bound). Refusals by a cap are counted in
topod_allocation_requests_total{result="rejected",reason="uid_quota"|"group_quota"}.

decision_latency buckets are per-bucket counts (not cumulative), keyed by upper bound;
LatencyHistogram keeps them for the daemon, with DEFAULT_BUCKETS from 10 us (a decision
takes 0.05-0.3 ms, so the low buckets are where the quantiles are).

Allocation requests come in one of three forms; when a snapshot holds several (a daemon
moving from one to another), the richest is rendered and the others must give the same
count per result, or the render fails naming both:
  - "requests": a list of {"result", "reason", "count"} (the preferred form);
  - "requests_by_result_reason": {(result, reason): count};
  - "requests_by_result": {result: count}, the older form: reason is "" for all.
`result` is what happened (granted, denied, invalid, rejected, queue_full, timeout,
abandoned, failed); `reason` is a machine-readable code (an error's `code`, such as
insufficient_gpus) or "" when there is none. Reasons must be snake_case codes
(`[a-z0-9_]`, at most 64 characters): a free-text message would make one time series per
message, so it is rejected here rather than left to blow up Prometheus.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "topod_"
# Upper bounds in seconds (+Inf is implied). Decisions take 0.05-0.3 ms: the buckets start
# at 10 us so that quantiles come from counts, not from interpolating inside one bucket.
DEFAULT_BUCKETS = (1e-05, 2.5e-05, 5e-05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


@dataclass(slots=True)
class LatencyHistogram:
    """Decision latencies, bucketed as they are observed (the daemon keeps one)."""

    bounds: tuple[float, ...] = DEFAULT_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)) or not self.bounds:
            raise ValueError("LatencyHistogram: bounds must be distinct and increasing")
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def to_snapshot(self) -> dict[str, object]:
        buckets: dict[float, int] = dict(zip(self.bounds, self.counts))
        buckets[math.inf] = self.counts[-1]
        return {"buckets": buckets, "sum": self.total, "count": sum(self.counts)}


def render_metrics(snapshot: Mapping[str, Any]) -> str:
    """The text exposition format (version 0.0.4) of one snapshot."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot))
    return generate_latest(registry).decode("utf-8")


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _SnapshotCollector:
    def __init__(self, snapshot: Mapping[str, Any]) -> None:
        unknown = set(snapshot) - set(_SECTIONS) - set(_REQUEST_FORMS)
        if unknown:
            raise ValueError(f"metrics snapshot: unknown sections {sorted(unknown)}")
        forms = [key for key in _REQUEST_FORMS if snapshot.get(key) is not None]
        self.snapshot = snapshot
        self.requests_form = forms[0] if forms else None  # the richest form given
        if len(forms) > 1:
            _check_request_forms_agree(snapshot, forms)

    def collect(self) -> Iterator[object]:
        for key, builder in _SECTIONS.items():
            if key == "requests":
                if self.requests_form is not None:
                    yield from _requests(self.requests_form, self.snapshot[self.requests_form])
                continue
            value = self.snapshot.get(key)
            if value is not None:
                yield from builder(value)


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"metrics snapshot: {where} must be a number, got {value!r}")
    return float(value)


def _build(value: Mapping[str, object]) -> Iterator[object]:
    from prometheus_client.core import InfoMetricFamily

    yield InfoMetricFamily(PREFIX + "build", "topod build information", value={k: str(v) for k, v in value.items()})


def _nvlink_domain(value: Mapping[str, Any]) -> Iterator[object]:
    """topod_nvlink_domain_info{cluster_uuid,clique_id} 1 per clique: the snapshot key
    `nvlink_domain` takes the topology JSON's `nvlink_domain` object."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "nvlink_domain_info", "multi-node NVLink domain (cluster UUID and clique) "
                               "of this host's GPUs", labels=["cluster_uuid", "clique_id"])
    for clique in value.get("clique_ids", []):
        family.add_metric([str(value.get("cluster_uuid")), str(clique)], 1.0)
    yield family


def _gpu_info(value: list[Mapping[str, object]]) -> Iterator[object]:
    """topod_gpu_info{gpu,address,vendor,model} 1 per GPU: join it on `gpu` to label any GPU
    series by vendor and model (mixed NVIDIA and AMD hosts alike)."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "gpu_info", "each GPU's vendor and model",
                               labels=["gpu", "address", "vendor", "model"])
    for gpu in value:
        family.add_metric([str(gpu.get("index")), str(gpu.get("address")), str(gpu.get("vendor") or ""),
                           str(gpu.get("model") or "")], 1.0)
    yield family


def _gpus(value: Mapping[str, object]) -> Iterator[object]:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "gpus", "GPUs by state", labels=["state"])
    for state, count in sorted(value.items()):
        family.add_metric([str(state)], _number(f"gpus_by_state.{state}", count))
    yield family


def _nics(value: Mapping[str, object]) -> Iterator[object]:
    """topod_nics{state}: RDMA NIC ports free, carried by a lease, or down (not ACTIVE:
    never offered). Left out on a host without RDMA devices."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "nics", "RDMA NIC ports by state (free, leased, down)", labels=["state"])
    for state, count in sorted(value.items()):
        family.add_metric([str(state)], _number(f"nics_by_state.{state}", count))
    yield family


def _leases(value: list[Mapping[str, object]]) -> Iterator[object]:
    """Totals over the active leases, no series per lease: a lease id as a label would add
    series for every lease ever granted (per-lease detail is GET /v1/leases')."""
    from prometheus_client.core import GaugeMetricFamily

    yield GaugeMetricFamily(PREFIX + "leases_active", "active leases (with GPUs or without)", value=len(value))
    held_cpus, ratios = 0.0, []
    for lease in value:
        lease_id = str(lease["id"])
        if lease.get("cpus") is not None:
            held_cpus += _number(f"leases[{lease_id}].cpus", lease["cpus"])
        if lease.get("satisfaction") is not None:
            ratio = _number(f"leases[{lease_id}].satisfaction", lease["satisfaction"])
            if not 0.0 <= ratio <= 1.0:
                raise ValueError(f"metrics snapshot: leases[{lease_id}].satisfaction {ratio} is outside 0..1")
            ratios.append(ratio)
    yield GaugeMetricFamily(PREFIX + "leased_cpus", "CPUs held by active leases", value=held_cpus)
    if ratios:
        yield GaugeMetricFamily(
            PREFIX + "lease_topology_satisfaction_min_ratio",
            "the lowest share of local (same NUMA node) links among an active lease's GPU pairs; 1 for one GPU",
            value=min(ratios))


def _gpu_leased(value: Mapping[object, object]) -> Iterator[object]:
    """topod_gpu_leased{gpu}: 1 while the GPU is in a lease, else 0; one series per GPU."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "gpu_leased", "1 while the GPU is in a lease, else 0", labels=["gpu"])
    for index, held in sorted(value.items(), key=lambda item: int(item[0])):
        flag = _number(f"gpu_leased.{index}", held)
        if flag not in (0.0, 1.0):
            raise ValueError(f"metrics snapshot: gpu_leased.{index} must be 0 or 1, got {held!r}")
        family.add_metric([str(int(index))], flag)
    yield family


def _latency(value: Mapping[str, Any]) -> Iterator[object]:
    from prometheus_client.core import HistogramMetricFamily

    buckets = sorted((float(bound), int(count)) for bound, count in value["buckets"].items())
    if not buckets or buckets[-1][0] != math.inf:
        buckets.append((math.inf, 0))
    cumulative, running = [], 0
    for bound, count in buckets:
        running += count
        cumulative.append(("+Inf" if bound == math.inf else repr(bound), running))
    if running != int(value.get("count", running)):
        raise ValueError(f"metrics snapshot: decision_latency count {value['count']} != bucket total {running}")
    family = HistogramMetricFamily(PREFIX + "allocation_decision_seconds", "time to compute one allocation decision")
    family.add_metric([], cumulative, sum_value=_number("decision_latency.sum", value.get("sum", 0.0)))
    yield family


_REASON = re.compile(r"[a-z0-9_]{0,64}")


def _request_rows(form: str, value: Any) -> Iterator[tuple[str, str, object]]:
    """(result, reason, count) from any of the three forms (see the module docstring)."""
    if form == "requests":
        if not isinstance(value, list):
            raise ValueError(f"metrics snapshot: requests must be a list of {{result, reason, count}}, got {value!r}")
        for row in value:
            if not isinstance(row, Mapping) or set(row) - {"result", "reason", "count"} or "result" not in row:
                raise ValueError(f"metrics snapshot: requests row {row!r} must be {{result, reason, count}}")
            yield row["result"], row.get("reason", ""), row.get("count")
    elif form == "requests_by_result_reason":
        for key, count in value.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ValueError(f"metrics snapshot: requests_by_result_reason key {key!r} must be (result, reason)")
            yield key[0], key[1], count
    else:
        for result, count in value.items():
            yield result, "", count


def _check_request_forms_agree(snapshot: Mapping[str, Any], forms: list[str]) -> None:
    """Several forms at once (a daemon switching forms): the richest is rendered, and the
    others must count the same requests per result, or the snapshot is wrong somewhere."""
    totals = []
    for form in forms:
        per_result: dict[object, float] = {}
        for result, _reason, count in _request_rows(form, snapshot[form]):
            per_result[result] = per_result.get(result, 0.0) + _number(f"{form}[{result}].count", count)
        totals.append(per_result)
    for form, per_result in zip(forms[1:], totals[1:]):
        if per_result != totals[0]:
            raise ValueError(f"metrics snapshot: {forms[0]} and {form} disagree: "
                             f"{dict(sorted(totals[0].items()))} != {dict(sorted(per_result.items()))}")


def _requests(form: str, value: Any) -> Iterator[object]:
    from prometheus_client.core import CounterMetricFamily

    counts: dict[tuple[str, str], float] = {}
    for result, reason, count in _request_rows(form, value):
        if not isinstance(result, str) or not result:
            raise ValueError(f"metrics snapshot: {form}: result {result!r} must be a non-empty string")
        if not isinstance(reason, str) or not _REASON.fullmatch(reason):
            raise ValueError(f"metrics snapshot: {form}[{result}]: reason {reason!r} must be a snake_case code "
                             "([a-z0-9_], at most 64 characters) or empty")
        number = _number(f"{form}[{result},{reason}].count", count)
        if number < 0:
            raise ValueError(f"metrics snapshot: {form}[{result},{reason}].count {number:g} is negative")
        if (result, reason) in counts:
            raise ValueError(f"metrics snapshot: {form}: ({result}, {reason}) given twice")
        counts[result, reason] = number
    family = CounterMetricFamily(PREFIX + "allocation_requests", "allocation requests by result and reason",
                                 labels=["result", "reason"])
    for (result, reason), number in sorted(counts.items()):
        family.add_metric([result, reason], number)
    yield family


def _irq_moves(value: object) -> Iterator[object]:
    from prometheus_client.core import CounterMetricFamily

    yield CounterMetricFamily(PREFIX + "irq_moves", "IRQ affinity changes written", value=_number("irq_moves", value))


def _cpu_rates(value: Mapping[object, object]) -> Iterator[object]:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "cpu_interrupts_per_second", "hardware interrupts per second, last cycle",
                               labels=["cpu"])
    for cpu, rate in sorted(value.items(), key=lambda item: int(item[0])):  # type: ignore[arg-type]
        family.add_metric([str(cpu)], _number(f"cpu_interrupt_rates.{cpu}", rate))
    yield family


def _bandwidth(value: list[Mapping[str, object]]) -> Iterator[object]:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "link_bandwidth_bytes_per_second", "measured transfer rate of a probed path",
                               labels=["src", "dst"])
    for row in value:
        where = f"link_bandwidth[{row.get('src')}->{row.get('dst')}]"
        family.add_metric([str(row["src"]), str(row["dst"])], _number(where, row["bytes_per_second"]))
    yield family


def _gpu_caps(value: list[Mapping[str, object]]) -> Iterator[object]:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(PREFIX + "gpu_cap", "configured GPU cap: per uid ([alloc] max_gpus_per_uid) or "
                               "per group (max_gpus_per_group)", labels=["scope", "group"])
    for row in value:
        scope = row.get("scope")
        if scope not in ("uid", "group"):
            raise ValueError(f"metrics snapshot: gpu_caps row {row!r}: scope must be uid or group")
        family.add_metric([str(scope), str(row.get("group", ""))], _number(f"gpu_caps[{scope}].cap", row.get("cap")))
    yield family


def _probe(value: Mapping[str, object]) -> Iterator[object]:
    from prometheus_client.core import GaugeMetricFamily

    if "duration_seconds" in value:
        yield GaugeMetricFamily(PREFIX + "probe_duration_seconds", "wall time of the last link probe cycle",
                                value=_number("probe.duration_seconds", value["duration_seconds"]))
    if "last_timestamp_seconds" in value:
        yield GaugeMetricFamily(PREFIX + "probe_last_timestamp_seconds", "when the last probe cycle ended (Unix time)",
                                value=_number("probe.last_timestamp_seconds", value["last_timestamp_seconds"]))


_SECTIONS = {
    "build": _build,
    "gpus_by_state": _gpus,
    "nics_by_state": _nics,
    "leases": _leases,
    "gpu_leased": _gpu_leased,
    "decision_latency": _latency,
    "requests": _requests,  # or one of _REQUEST_FORMS: see _SnapshotCollector
    "irq_moves": _irq_moves,
    "cpu_interrupt_rates": _cpu_rates,
    "link_bandwidth": _bandwidth,
    "probe": _probe,
    "nvlink_domain": _nvlink_domain,
    "gpu_caps": _gpu_caps,
    "gpu_info": _gpu_info,
}
_REQUEST_FORMS = ("requests", "requests_by_result_reason", "requests_by_result")
