"""Could the empty host ever satisfy a request (topod.alloc.feasibility), per resource, on
the h800 fixture: 8 H800 GPUs, two NUMA nodes of 16 cores x 2 threads (32 CPUs each), one
active RDMA NIC port per GPU (8 in all)."""

from __future__ import annotations

import pytest

from topod.alloc.engine import allocate
from topod.alloc.errors import InsufficientCpusError, InsufficientGpusError, InsufficientNicsError
from topod.alloc.feasibility import impossibility
from topod.alloc.policy import PolicySettings
from topod.alloc.request import FreeState, Request


@pytest.fixture()
def h800(host):
    return host("h800-8gpu")


def test_more_gpus_than_the_host_has_is_never_satisfiable(h800):
    error = impossibility(*h800, Request(gpus=9))
    assert isinstance(error, InsufficientGpusError) and error.retryable is False
    assert "9 GPUs requested; this host has 8 GPUs" in str(error)
    assert impossibility(*h800, Request(gpus=8)) is None


def test_a_model_the_host_lacks_is_never_satisfiable_and_names_the_hosts_models(h800):
    error = impossibility(*h800, Request(gpus=1, model="A100"))
    assert isinstance(error, InsufficientGpusError) and error.retryable is False
    assert "'A100'" in str(error) and "NVIDIA H800" in str(error)
    assert impossibility(*h800, Request(gpus=8, model="h800")) is None


def test_more_gpu_memory_than_any_gpu_has_is_never_satisfiable(h800):
    error = impossibility(*h800, Request(gpus=1, min_memory_mib=200_000))
    assert isinstance(error, InsufficientGpusError) and error.retryable is False
    assert "at least 200000 MiB" in str(error)
    assert impossibility(*h800, Request(gpus=1, min_memory_mib=80_000)) is None


@pytest.mark.parametrize("level", ["good", "best", "any"])
def test_more_cpus_per_gpu_than_any_node_has_is_never_satisfiable(h800, level):
    error = impossibility(*h800, Request(gpus=1, cpus_per_gpu=64, level=level))
    assert isinstance(error, InsufficientCpusError) and error.retryable is False
    assert "cpus_per_gpu 64" in str(error) and "32 (node 0)" in str(error)
    assert impossibility(*h800, Request(gpus=1, cpus_per_gpu=1000, level=level)) is not None
    assert impossibility(*h800, Request(gpus=1, cpus_per_gpu=32, level=level)) is None


def test_the_housekeeping_reserve_counts_against_what_a_node_could_ever_give(h800):
    topology, distances = h800
    request = Request(gpus=1, cpus_per_gpu=32, level="any")
    assert impossibility(topology, distances, request) is None
    # one CPU of each node reserved: its whole core is out, 30 CPUs are left on each node
    reserved = {min(node.cpus) for node in topology.numa_nodes}
    error = impossibility(topology, distances, request, reserved)
    assert isinstance(error, InsufficientCpusError) and error.retryable is False
    assert "30 (node 0)" in str(error)


def test_cpus_per_gpu_on_the_gpus_own_nodes_bounds_the_gpus_at_level_good_but_not_at_any(h800):
    # 16 CPUs per GPU: a 32-CPU node serves 2 of its 4 GPUs, so 8 GPUs never at 'good'
    error = impossibility(*h800, Request(gpus=8, cpus_per_gpu=16, level="good"))
    assert isinstance(error, InsufficientCpusError) and error.retryable is False
    assert "serve 4 of the 8" in str(error)
    # 4 GPUs at 'good' stay in one node (its 4 GPUs), which serves 2: only the empty host's
    # own decision finds it (the per-node count alone would allow it)
    error = impossibility(*h800, Request(gpus=4, cpus_per_gpu=16, level="good"))
    assert isinstance(error, InsufficientCpusError) and error.retryable is False
    assert "even with nothing leased" in str(error)
    assert impossibility(*h800, Request(gpus=4, cpus_per_gpu=16, level="any")) is None
    # 5 blocks of 16 on the host's 2 nodes of 32: never, even at 'any'
    assert isinstance(impossibility(*h800, Request(gpus=5, cpus_per_gpu=16, level="any")), InsufficientCpusError)


def test_auto_cpus_never_make_a_request_impossible(h800):
    assert impossibility(*h800, Request(gpus=8, cpus_per_gpu="auto", level="best")) is None


def test_more_nic_ports_per_gpu_than_the_host_has_is_never_satisfiable(h800):
    error = impossibility(*h800, Request(gpus=1, nics_per_gpu=9))
    assert isinstance(error, InsufficientNicsError) and error.retryable is False
    assert "8 active RDMA NIC port(s)" in str(error)
    assert impossibility(*h800, Request(gpus=2, nics_per_gpu=8)) is None, "shared NICs: every GPU may take all 8"


def test_exclusive_nics_bound_the_whole_lease(h800):
    exclusive = PolicySettings(nics="exclusive")
    error = impossibility(*h800, Request(gpus=2, nics_per_gpu=8), (), exclusive)
    assert isinstance(error, InsufficientNicsError) and error.retryable is False
    assert "needs 16 NIC port(s)" in str(error)
    assert impossibility(*h800, Request(gpus=2, nics_per_gpu=4), (), exclusive) is None


def test_a_request_the_busy_host_refuses_is_still_possible_when_the_empty_host_grants_it(h800):
    topology, distances = h800
    busy = FreeState(busy_gpus=frozenset(g.index for g in topology.gpus))
    with pytest.raises(InsufficientGpusError) as now:
        allocate(topology, distances, busy, Request(gpus=1))
    assert now.value.retryable is True
    assert impossibility(topology, distances, Request(gpus=1)) is None


def test_a_kept_verdict_is_a_fresh_error_each_time(h800):
    first = impossibility(*h800, Request(gpus=1, cpus_per_gpu=64))
    second = impossibility(*h800, Request(gpus=1, cpus_per_gpu=64))
    assert first is not second and str(first) == str(second) and type(first) is type(second)


def test_labels_and_priorities_share_one_kept_verdict(h800):
    from topod.alloc.hostview import host_view

    topology, distances = h800
    kept = host_view(topology, distances).cache.setdefault("never", {})
    kept.clear()
    for job, priority in (("a", 0), ("b", 5), (None, -3)):
        assert impossibility(topology, distances, Request(gpus=9, job=job, priority=priority)) is not None
    assert len(kept) == 1, "a job label cannot make the daemon decide the empty host again"
