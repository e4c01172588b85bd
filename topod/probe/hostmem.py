"""The host-memory backend: CPU node i copying buffers bound to memory node j.

A thread pinned to node i's CPUs (os.sched_setaffinity on the calling thread) copies
between two buffers bound to node j with ctypes.memmove, which runs the C library's
memmove without the GIL, so the copy runs at memory speed without a compiled extension.

Binding, best first (the chosen way is written into every result's note):
  libnuma   numa_alloc_onnode / numa_free from libnuma.so.1 through ctypes
  mbind     an anonymous mapping bound with the mbind(2) syscall (MPOL_BIND)
  unbound   plain buffers, only on a single-node host, where there is nothing to bind to
On a multi-node host with neither libnuma nor mbind the backend refuses to start rather
than report unbound copies as if they were node-to-node figures.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from topod.probe.backend import LinkId, ProbeResult, ProbeSizes, ProbeUnavailable, median, node_end, node_of

BINDINGS = ("libnuma", "mbind", "unbound")
MPOL_BIND = 2
MAP_FAILED = ctypes.c_void_p(-1).value
SYS_MBIND = {"x86_64": 237, "aarch64": 235, "ppc64le": 259, "s390x": 268}
DEFAULT_SIZES = ProbeSizes(small_bytes=64, small_reps=64, large_bytes=16 << 20, large_reps=4)


class _Allocator:
    """Allocates and frees node-bound buffers one way; `binding` names which."""

    binding = "unbound"

    def alloc(self, size: int, node: int) -> tuple[int, Any]:
        raise NotImplementedError

    def free(self, address: int, size: int, handle: Any) -> None:
        raise NotImplementedError


class _LibnumaAllocator(_Allocator):
    binding = "libnuma"

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.max_node = int(lib.numa_max_node())

    def alloc(self, size: int, node: int) -> tuple[int, Any]:
        if node > self.max_node:
            raise ProbeUnavailable(f"memory node {node} does not exist here (libnuma sees nodes 0-{self.max_node})")
        address = self.lib.numa_alloc_onnode(ctypes.c_size_t(size), ctypes.c_int(node))
        if not address:
            raise ProbeUnavailable(f"numa_alloc_onnode({size}, {node}) failed: node {node} has no free memory")
        return int(address), None

    def free(self, address: int, size: int, handle: Any) -> None:
        self.lib.numa_free(ctypes.c_void_p(address), ctypes.c_size_t(size))


class _MbindAllocator(_Allocator):
    binding = "mbind"

    def __init__(self, number: int) -> None:
        self.number = number
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_long]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.syscall.restype = ctypes.c_long

    def alloc(self, size: int, node: int) -> tuple[int, Any]:
        libc = self.libc
        address = libc.mmap(None, ctypes.c_size_t(size), mmap.PROT_READ | mmap.PROT_WRITE,
                            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, ctypes.c_long(0))
        if address in (None, MAP_FAILED):
            raise ProbeUnavailable(f"mmap of {size} bytes failed: {os.strerror(ctypes.get_errno())}")
        words = node // 64 + 1
        mask = (ctypes.c_ulong * words)()
        mask[node // 64] = 1 << (node % 64)
        # The kernel counts maxnode bits and drops the last one (mbind(2) NOTES).
        rc = libc.syscall(ctypes.c_long(self.number), ctypes.c_void_p(address), ctypes.c_ulong(size),
                          ctypes.c_int(MPOL_BIND), ctypes.byref(mask), ctypes.c_ulong(words * 64 + 1),
                          ctypes.c_uint(0))
        if rc != 0:
            err = ctypes.get_errno()
            libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))
            raise ProbeUnavailable(f"mbind to node {node} failed: {os.strerror(err)}")
        return int(address), None

    def free(self, address: int, size: int, handle: Any) -> None:
        self.libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))


class _UnboundAllocator(_Allocator):
    binding = "unbound"

    def alloc(self, size: int, node: int) -> tuple[int, Any]:
        buffer = ctypes.create_string_buffer(size)
        return ctypes.addressof(buffer), buffer

    def free(self, address: int, size: int, handle: Any) -> None:
        return None


def load_allocator(node_count: int, prefer: str | None = None) -> _Allocator:
    """The best binding this host offers (or `prefer`, checked); ProbeUnavailable otherwise."""
    order = [prefer] if prefer else list(BINDINGS)
    if prefer and prefer not in BINDINGS:
        raise ValueError(f"binding {prefer!r}: expected one of {', '.join(BINDINGS)}")
    reasons = []
    for binding in order:
        if binding == "libnuma":
            lib = _load_libnuma()
            if lib is not None:
                return _LibnumaAllocator(lib)
            reasons.append("libnuma.so.1 not loadable or numa_available() < 0")
        elif binding == "mbind":
            number = SYS_MBIND.get(platform.machine())
            if number is not None:
                return _MbindAllocator(number)
            reasons.append(f"no known mbind syscall number for {platform.machine()}")
        elif node_count == 1:
            return _UnboundAllocator()
        else:
            reasons.append(f"unbound buffers say nothing about {node_count} nodes")
    raise ProbeUnavailable("cannot bind buffers to NUMA nodes: " + "; ".join(reasons)
                           + " (install libnuma1 to enable the host-memory probe)")


def _load_libnuma() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libnuma.so.1", use_errno=True)
    except OSError:
        return None
    lib.numa_available.restype = ctypes.c_int
    lib.numa_max_node.restype = ctypes.c_int
    lib.numa_alloc_onnode.restype = ctypes.c_void_p
    lib.numa_alloc_onnode.argtypes = [ctypes.c_size_t, ctypes.c_int]
    lib.numa_free.restype = None
    lib.numa_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib if lib.numa_available() >= 0 else None


def run_pinned(cpus: tuple[int, ...], work: Callable[[], Any]) -> Any:
    """Run work on a fresh thread restricted to cpus; the daemon's own threads keep
    their affinity. Exceptions come back to the caller."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            os.sched_setaffinity(0, cpus)  # pid 0 = this thread only (Linux)
            box["value"] = work()
        except BaseException as exc:  # handed to the caller, not lost in the thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="topod-probe", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _timer_overhead_ns(samples: int = 32) -> int:
    deltas = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        deltas.append(time.perf_counter_ns() - t0)
    return int(median(deltas))


@dataclass(slots=True)
class HostMemoryBackend:
    """mem/nodeI/nodeJ links for every CPU node I this process may run on and every
    memory node J."""

    cpu_nodes: Mapping[int, tuple[int, ...]]  # node -> CPUs we may run on
    memory_nodes: tuple[int, ...]
    sizes: ProbeSizes = DEFAULT_SIZES
    binding: str | None = None  # force one of BINDINGS (tests); None = best available
    name: str = "host-memory"
    _allocator: _Allocator = field(init=False)

    def __post_init__(self) -> None:
        if not self.cpu_nodes:
            raise ProbeUnavailable("host-memory probe: this process may run on no CPU of any NUMA node")
        node_count = len(set(self.cpu_nodes) | set(self.memory_nodes))
        self._allocator = load_allocator(node_count, self.binding)

    @classmethod
    def from_topology(cls, topology, sizes: ProbeSizes | None = None,  # noqa: ANN001 - a Topology
                      binding: str | None = None) -> HostMemoryBackend:
        allowed = os.sched_getaffinity(0)
        cpu_nodes = {node.id: tuple(c for c in node.cpus if c in allowed) for node in topology.numa_nodes}
        cpu_nodes = {node: cpus for node, cpus in cpu_nodes.items() if cpus}
        memory = tuple(node.id for node in topology.numa_nodes if node.memory_bytes != 0)
        return cls(cpu_nodes, memory, sizes or DEFAULT_SIZES, binding)

    @property
    def binding_used(self) -> str:
        return self._allocator.binding

    def links(self) -> list[LinkId]:
        return [LinkId("mem", node_end(i), node_end(j)) for i in sorted(self.cpu_nodes) for j in self.memory_nodes]

    def measure(self, link: LinkId) -> ProbeResult:
        cpu_node, mem_node = node_of(link.src), node_of(link.dst)
        if link.kind != "mem" or cpu_node is None or mem_node is None:
            raise ProbeUnavailable(f"{link}: the host-memory backend measures mem/nodeI/nodeJ links only")
        if cpu_node not in self.cpu_nodes or mem_node not in self.memory_nodes:
            raise ProbeUnavailable(f"{link}: node {cpu_node} has no CPU this process may use, or {mem_node} no memory")
        started, wall = time.perf_counter(), time.time()
        latency_ns, bandwidth = run_pinned(self.cpu_nodes[cpu_node], lambda: self._copy(mem_node))
        seconds = time.perf_counter() - started
        note = ("unbound buffers: single-node host" if self._allocator.binding == "unbound"
                else f"buffers bound to node {mem_node} with {self._allocator.binding}")
        return ProbeResult(link, latency_ns / 1000.0, bandwidth / 1e9, self.sizes, seconds,
                           self.sizes.bytes_per_link, wall, self.name,
                           note + "; latency includes Python call overhead")

    def _copy(self, node: int) -> tuple[float, float]:
        size = self.sizes.large_bytes
        src_addr, src_handle = self._allocator.alloc(size, node)
        try:
            dst_addr, dst_handle = self._allocator.alloc(size, node)
            try:
                ctypes.memset(src_addr, 1, size)  # fault the pages in under the binding
                ctypes.memset(dst_addr, 0, size)
                return self._small(dst_addr, src_addr), self._large(dst_addr, src_addr)
            finally:
                self._allocator.free(dst_addr, size, dst_handle)
        finally:
            self._allocator.free(src_addr, size, src_handle)

    def _small(self, dst: int, src: int) -> float:
        overhead = _timer_overhead_ns()
        small, timings = self.sizes.small_bytes, []
        for _ in range(self.sizes.small_reps):
            t0 = time.perf_counter_ns()
            ctypes.memmove(dst, src, small)
            timings.append(time.perf_counter_ns() - t0 - overhead)
        return max(1.0, median(timings))  # a timer finer than the copy still sees >= 1 ns

    def _large(self, dst: int, src: int) -> float:
        large, rates = self.sizes.large_bytes, []
        for _ in range(self.sizes.large_reps):
            t0 = time.perf_counter_ns()
            ctypes.memmove(dst, src, large)
            rates.append(large / max(1, time.perf_counter_ns() - t0) * 1e9)
        return median(rates)

    def close(self) -> None:
        return None  # buffers live for one measurement only
