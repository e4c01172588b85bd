"""Link names, probe sizes and the backend factory."""

from __future__ import annotations

import pytest

from topod.errors import ConfigError
from topod.probe.backend import (
    LinkId,
    LinkSyntaxError,
    ProbeResult,
    ProbeSizes,
    measurements_of,
    parse_link,
)
from topod.probe.registry import open_backend

GPUS = {0: "0000:13:00.0", 1: "0000:14:00.0"}


def test_link_round_trips_through_its_name():
    link = LinkId("h2d", "node1", "0000:13:00.0")
    assert parse_link(str(link)) == link
    assert link.device == "0000:13:00.0" and link.host_node == 1


def test_gpu_index_ends_resolve_to_pci_addresses():
    assert parse_link("p2p/gpu1/gpu0", GPUS) == LinkId("p2p", "0000:14:00.0", "0000:13:00.0")
    assert parse_link("p2p/gpu1/gpu0", GPUS).pair == ("0000:13:00.0", "0000:14:00.0")


@pytest.mark.parametrize("text, words", [
    ("p2p/gpu0", "expected kind/src/dst"),
    ("nvl/gpu0/gpu1", "kind 'nvl' is not one of"),
    ("h2d/gpu0/node0", "goes node -> pci"),
    ("mem/node0/0000:13:00.0", "goes node -> node"),
    ("p2p/gpu0/gpu0", "two different devices"),
    ("p2p/gpu0/gpu9", "no GPU 9"),
    ("p2p/gpu0/eth0", "neither nodeN, gpuN nor a PCI address"),
])
def test_bad_link_names_say_what_is_wrong(text, words):
    with pytest.raises(LinkSyntaxError, match=words):
        parse_link(text, GPUS)


def test_non_string_link_is_rejected():
    with pytest.raises(LinkSyntaxError, match="must be a string"):
        parse_link(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["small_bytes", "small_reps", "large_bytes", "large_reps"])
def test_probe_sizes_must_be_positive_integers(field):
    with pytest.raises(ValueError, match=field):
        ProbeSizes(**{field: 0})


def test_measurements_are_per_link_medians():
    link = LinkId("mem", "node0", "node0")
    sizes = ProbeSizes()
    pairs = ((10.0, 1.0), (30.0, 3.0), (12.0, 2.0))
    results = [ProbeResult(link, lat, bw, sizes, 0.01, 1, 0.0, "t") for bw, lat in pairs]
    (m,) = measurements_of(results)
    assert (m.bandwidth_gbps, m.latency_us, m.samples) == (12.0, 2.0, 3)


def test_unknown_backend_names_the_choices():
    with pytest.raises(ConfigError, match="host-memory, cuda or simulated"):
        open_backend("rdma", topology=None)
    with pytest.raises(ConfigError, match="needs a ground-truth table"):
        open_backend("simulated:", topology=None)
