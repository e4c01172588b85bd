"""Fixtures shared by the allocator's unit tests."""

from __future__ import annotations

import pytest

from topod.discover import discover
from topod.distance import DistanceModel
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.hostspec.synthetic import HOSTS as SYNTHETIC
from topod.hostspec.synthetic import build_synthetic


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """name -> (topology, distance model) of a built-in or synthetic host, built once per module."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            if name in SYNTHETIC:
                topology = build_synthetic(name, tmp_path_factory.mktemp(name))
            else:
                root = build_host(load_builtin_spec(name), tmp_path_factory.mktemp(name))
                topology = discover(HostRoot(root), live_nvml=False)
            cache[name] = (topology, DistanceModel(topology))
        return cache[name]

    return get
