"""The simulated backend driving the probe loop: degradation over time, back-off, leases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topod.discover import discover
from topod.distance import DistanceModel
from topod.errors import ConfigError
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.probe.backend import LinkId, ProbeSizes
from topod.probe.linkstate import LinkState
from topod.probe.sampler import Sampler, SamplerSettings, run_cycle
from topod.probe.simulated import SimulatedBackend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
UPLINK = FIXTURES / "pcie-8gpu-uplink-degrades.json"
SMALL = ProbeSizes(small_bytes=4096, small_reps=8, large_bytes=1 << 20, large_reps=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def pcie_host(tmp_path_factory):
    return discover(HostRoot(build_host(load_builtin_spec("pcie-8gpu"), tmp_path_factory.mktemp("pcie"))),
                    live_nvml=False)


@pytest.fixture()
def loop(pcie_host):
    clock = Clock()
    # Small transfers keep a cycle's (simulated) cost far below the 1 % budget floor.
    backend = SimulatedBackend.from_file(UPLINK, pcie_host, clock=clock, sizes=SMALL)
    state = LinkState(backend.links())
    sampler = Sampler(SamplerSettings(), started=clock.now)
    return clock, backend, state, sampler


def cycle_at(loop, t, leased=()):
    clock, backend, state, sampler = loop
    clock.now = 1000.0 + t
    return run_cycle(backend, state, sampler, leased, clock=clock)


def address(topology, index):
    return topology.gpu(index).address


def test_backend_offers_host_and_peer_links_of_the_host(pcie_host, loop):
    links = loop[1].links()
    kinds = [link.kind for link in links]
    assert kinds.count("p2p") == 28 and kinds.count("h2d") == kinds.count("d2h") == 16 and kinds.count("mem") == 4


def test_stable_links_back_off_the_interval(loop):
    intervals = [cycle_at(loop, t).interval_s for t in (0, 30, 90, 210)]  # each when due; before the fault
    assert intervals[0] == 30.0  # first cycle: nothing to compare with
    assert intervals[1:] == [60.0, 120.0, 240.0]
    assert loop[3].seconds_until_due(1000.0 + 210) == 240.0


def test_a_lease_change_resets_the_interval_and_spares_the_leased_gpus(pcie_host, loop):
    for t in (0, 30, 90):
        cycle_at(loop, t)
    sampler = loop[3]
    assert sampler.interval == 120.0
    sampler.on_lease_change(1000.0 + 100)
    assert sampler.interval == 30.0 and sampler.seconds_until_due(1000.0 + 100) == pytest.approx(20.0)
    gpu0 = address(pcie_host, 0)
    report = cycle_at(loop, 120, leased=[gpu0])
    assert report.results and all(gpu0 not in (r.link.src, r.link.dst) for r in report.results)
    assert len(report.skipped) == 7 + 2 + 2  # 7 peers, h2d and d2h from two nodes
    assert all("held by a lease" in reason for _, reason in report.skipped)


def test_a_degrading_switch_uplink_raises_the_weight_of_pairs_across_it(pcie_host, loop):
    gpu0, gpu1, gpu2 = (address(pcie_host, i) for i in range(3))
    for t in (0, 60, 120, 180, 240):
        assert cycle_at(loop, t).summary.events == ()
    before = DistanceModel(pcie_host, loop[2].corrections()).gpus(0, 2)
    events = [e for t in (300, 330, 360) for e in cycle_at(loop, t).summary.events]
    degraded = {e.link for e in events if e.event == "link_degraded"}
    assert LinkId("p2p", gpu0, gpu2) in degraded and LinkId("h2d", "node0", gpu0) in degraded
    assert LinkId("p2p", gpu0, gpu1) not in degraded  # both below the switch: no uplink crossed
    corrections = loop[2].corrections()
    assert corrections[(gpu0, gpu2)] == pytest.approx(4.0, rel=0.05)  # the uplink gives a quarter
    assert (gpu0, gpu1) not in corrections
    after = DistanceModel(pcie_host, corrections)
    assert after.gpus(0, 2).level == before.level and after.gpus(0, 2).weight > 3 * before.weight
    assert after.gpus(0, 1).weight == DistanceModel(pcie_host).gpus(0, 1).weight
    # The sampler saw the deviation and probes densely again.
    assert loop[3].interval == 30.0


def test_the_uplink_recovering_restores_the_weights(pcie_host, loop):
    for t in (0, 60, 120, 300, 330, 360):
        cycle_at(loop, t)
    assert loop[2].corrections()
    events = [e for t in (900, 930) for e in cycle_at(loop, t).summary.events]
    assert events and {e.event for e in events} == {"link_recovered"}
    assert loop[2].corrections() == {} and loop[2].degraded() == []


def write(tmp_path, table, name="t.json"):
    path = tmp_path / name
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    return path


def table():
    return json.loads(UPLINK.read_text())


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.update(colour="red"), "unknown key\\(s\\) colour"),
    (lambda t: t["classes"].pop("h2d_local"), "classes.h2d_local needs bandwidth_gbps"),
    (lambda t: t["classes"]["p2p"].pop("SYS"), "classes.p2p.SYS is missing"),
    (lambda t: t["classes"]["mem_local"].update(bandwidth_gbps=-1), "must be a positive number"),
    (lambda t: t["degradations"][0].update(factor=2), "factor must be a number in \\(0, 1\\]"),
    (lambda t: t["degradations"][0].pop("through_switch_of"), "needs 'link' or 'through_switch_of'"),
    (lambda t: t["degradations"][0].update(through_switch_of="node0"), "no device below a PCIe switch"),
    (lambda t: t.update(links={"p2p/gpu0/gpu42": {}}), "no GPU 42"),
    (lambda t: t.update(true_numa_node={"gpu3": "one"}), "true_numa_node must map"),
])
def test_bad_ground_truth_tables_name_the_key(tmp_path, pcie_host, edit, words):
    bad = table()
    edit(bad)
    with pytest.raises(ConfigError, match=words):
        SimulatedBackend.from_file(write(tmp_path, bad), pcie_host)


def test_unreadable_or_malformed_tables_are_config_errors(tmp_path, pcie_host):
    with pytest.raises(ConfigError, match="cannot read"):
        SimulatedBackend.from_file(tmp_path / "missing.json", pcie_host)
    with pytest.raises(ConfigError, match="not valid JSON"):
        SimulatedBackend.from_file(write(tmp_path, "{", "bad.json"), pcie_host)


def test_the_budget_stretches_the_interval_for_an_expensive_cycle(pcie_host):
    clock = Clock()
    backend = SimulatedBackend.from_file(UPLINK, pcie_host, clock=clock)  # default sizes: 32 MiB x 3 per link
    sampler = Sampler(SamplerSettings(), started=clock.now)
    report = run_cycle(backend, LinkState(backend.links()), sampler, clock=clock)
    assert report.summary.seconds > 0.5  # 64 links on an 8-GPU host
    assert report.interval_s == pytest.approx(report.summary.seconds / 0.01)


def test_a_toml_table_works_like_json(tmp_path, pcie_host):
    text = "\n".join(["noise = 0.0", "[classes]"] + [
        f"{name} = {{ bandwidth_gbps = 10.0, latency_us = 1.0 }}"
        for name in ("mem_local", "mem_remote", "h2d_local", "h2d_remote", "d2h_local", "d2h_remote")
    ] + ["[classes.p2p]"] + [f"{level} = {{ bandwidth_gbps = 5.0 }}" for level in ("PIX", "PXB", "PHB", "NODE", "SYS")])
    backend = SimulatedBackend.from_file(write(tmp_path, text, "t.toml"), pcie_host)
    result = backend.measure(LinkId("h2d", "node0", address(pcie_host, 0)))
    assert result.bandwidth_gbps == 10.0 and result.seconds > 0 and result.bytes_moved == result.sizes.bytes_per_link


def test_a_table_that_is_a_fifo_or_nests_too_deep_is_one_config_error(tmp_path):
    """The daemon loads the table ([probe] simulated_table) at start and on reload: a
    FIFO must not block it, a pathological file must not crash it."""
    import os

    from timebox import within
    from topod.probe.simulated import load_table

    fifo = tmp_path / "table.json"
    os.mkfifo(fifo)
    with within(5), pytest.raises(ConfigError, match="link table .*: not a regular file \\(a FIFO\\)"):
        load_table(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ConfigError, match="not valid JSON: nested too deep"):
        load_table(deep)
