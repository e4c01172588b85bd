"""Parsing of RDMA port attributes (infiniband/<dev>/ports/<n>/...)."""

from __future__ import annotations

import pytest

from topod.discover.rdma import parse_link_layer, parse_phys_state, parse_port_state
from topod.model import RdmaPort


@pytest.mark.parametrize(("text", "state"), [
    ("4: ACTIVE\n", "ACTIVE"), ("1: DOWN", "DOWN"), ("2: INIT\n", "INIT"), ("ACTIVE", "ACTIVE"),
    ("5: ACTIVE_DEFER", "ACTIVE_DEFER"), ("4: active", None), ("x: ACTIVE", None), ("", None), (None, None),
    ("4: UP", None),
])
def test_port_state_is_read_as_the_kernel_writes_it(text, state):
    assert parse_port_state(text) == state


def test_phys_state_and_link_layer_parse_or_are_unknown():
    assert parse_phys_state("5: LinkUp\n") == "LinkUp"
    assert parse_phys_state("3: Disabled") == "Disabled"
    assert parse_phys_state("x: LinkUp") is None
    assert parse_phys_state("") is None
    assert parse_link_layer("InfiniBand\n") == "InfiniBand"
    assert parse_link_layer("Ethernet") == "Ethernet"
    assert parse_link_layer("Token Ring") is None


def test_only_an_active_port_is_usable():
    assert RdmaPort("mlx5_0", 1, "ACTIVE").active
    assert not RdmaPort("mlx5_0", 1, "DOWN").active
    assert not RdmaPort("mlx5_0", 1, "INIT").active
    assert not RdmaPort("mlx5_0", 1, "unknown").active
