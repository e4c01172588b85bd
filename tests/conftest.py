"""Shared fixtures: host trees built from the built-in specs, and the real corpus."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from topod.discover import discover
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec

# Vendored test data (a fresh clone has it; nothing reads ../shared): hwloc's real-host
# corpus (BSD-3-Clause, HWLOC-COPYING beside it) and the NodeResourceTopology CRD.
DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "hosts"
K8S_DATA = DATA / "k8s"
_BUILT: dict[str, Path] = {}
_BUILDS = itertools.count()  # each build its own directory (two override builds never share one)


@pytest.fixture(scope="session")
def _tree_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hosts")


@pytest.fixture()
def host_tree(_tree_cache: Path, tmp_path: Path):
    """host_tree('h800-8gpu') -> a fresh, writable copy of that built-in host's tree."""

    def make(name: str, **overrides: object) -> Path:
        cached = _BUILT.get(name)
        if cached is None or overrides:
            spec = load_builtin_spec(name)
            spec.update(overrides)
            cached = build_host(spec, _tree_cache / f"{name}-{next(_BUILDS)}")
            if not overrides:
                _BUILT[name] = cached
        target = tmp_path / name
        shutil.copytree(cached, target, symlinks=True)
        return target

    return make


@pytest.fixture(scope="session")
def readonly_host(tmp_path_factory: pytest.TempPathFactory):
    """readonly_host('h800-8gpu') -> (HostRoot, Topology), built once per session and shared;
    for tests that only read the tree (write to a host_tree copy instead)."""
    cache: dict[str, tuple[HostRoot, object]] = {}

    def make(name: str):
        if name not in cache:
            host = HostRoot(build_host(load_builtin_spec(name), tmp_path_factory.mktemp(f"ro-{name}")))
            cache[name] = (host, discover(host, live_nvml=False))
        return cache[name]

    return make


@pytest.fixture()
def topology_of(host_tree):
    """topology_of('h800-8gpu') -> the discovered Topology of a fresh copy of that host."""

    def make(name: str):
        return discover(HostRoot(host_tree(name)), live_nvml=False)

    return make
