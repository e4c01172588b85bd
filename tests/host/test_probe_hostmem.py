"""The host-memory backend really copies on this machine (no /sys is read or written)."""

from __future__ import annotations

import os

import pytest

from topod.probe.backend import LinkId, ProbeSizes, ProbeUnavailable
from topod.probe.hostmem import HostMemoryBackend, load_allocator, run_pinned

SIZES = ProbeSizes(small_bytes=64, small_reps=16, large_bytes=4 << 20, large_reps=3)
ALLOWED = tuple(sorted(os.sched_getaffinity(0)))
LOCAL = LinkId("mem", "node0", "node0")


def available(binding):
    try:
        load_allocator(1, binding)
    except ProbeUnavailable:
        return False
    return True


@pytest.mark.parametrize("binding", ["libnuma", "mbind", "unbound"])
def test_copies_return_plausible_latency_and_bandwidth(binding):
    if not available(binding):
        pytest.skip(f"{binding} is not available on this machine")
    backend = HostMemoryBackend({0: ALLOWED}, (0,), SIZES, binding=binding)
    assert backend.links() == [LOCAL]
    result = backend.measure(LOCAL)
    assert result.latency_us > 0
    assert 0.1 < result.bandwidth_gbps < 1000.0  # between 100 MB/s and 1 TB/s
    assert result.sizes == SIZES and result.bytes_moved == 64 * 16 + (4 << 20) * 3
    assert result.seconds > 0 and result.backend == "host-memory"
    assert binding in result.note


def test_the_best_binding_is_chosen_and_named():
    best = next(b for b in ("libnuma", "mbind", "unbound") if available(b))
    backend = HostMemoryBackend({0: ALLOWED}, (0,), SIZES)
    note = backend.measure(LOCAL).note
    assert backend.binding_used == best
    assert (f"with {best}" in note) if best != "unbound" else ("unbound buffers: single-node host" in note)


def test_unbound_buffers_are_refused_on_a_multi_node_host():
    with pytest.raises(ProbeUnavailable, match="unbound buffers say nothing about 2 nodes"):
        HostMemoryBackend({0: ALLOWED}, (0, 1), SIZES, binding="unbound")


def test_a_node_this_process_cannot_run_on_is_unavailable():
    backend = HostMemoryBackend({0: ALLOWED}, (0,), SIZES)
    with pytest.raises(ProbeUnavailable, match="node 3 has no CPU"):
        backend.measure(LinkId("mem", "node3", "node0"))
    with pytest.raises(ProbeUnavailable, match="mem/nodeI/nodeJ links only"):
        backend.measure(LinkId("h2d", "node0", "0000:13:00.0"))


def test_a_missing_memory_node_is_reported_not_faked():
    if not available("mbind"):
        pytest.skip("no mbind syscall number for this architecture")
    backend = HostMemoryBackend({0: ALLOWED}, (0, 63), SIZES, binding="mbind")
    with pytest.raises(ProbeUnavailable, match="mbind to node 63 failed"):
        backend.measure(LinkId("mem", "node0", "node63"))


def test_no_usable_cpu_is_an_explicit_error():
    with pytest.raises(ProbeUnavailable, match="no CPU"):
        HostMemoryBackend({}, (0,), SIZES)


def test_pinning_happens_on_a_worker_thread_only():
    before = os.sched_getaffinity(0)
    seen = run_pinned((ALLOWED[0],), lambda: os.sched_getaffinity(0))
    assert seen == {ALLOWED[0]} and os.sched_getaffinity(0) == before


def test_errors_in_the_pinned_thread_reach_the_caller():
    def boom():
        raise ProbeUnavailable("inner")

    with pytest.raises(ProbeUnavailable, match="inner"):
        run_pinned(ALLOWED, boom)
