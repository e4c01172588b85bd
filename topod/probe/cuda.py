"""The CUDA backend (optional): pinned host buffers per NUMA node <-> each GPU, and GPU
<-> GPU peer copies where peer access is possible.

Uses NVIDIA's cuda-python driver bindings (`cuda.bindings.driver`, or the older
`cuda.cuda`), imported only when the backend opens. Host buffers are bound to a node the
same way the host-memory backend binds them (libnuma, else mbind) and then pinned with
cuMemHostRegister, so "h2d/node1/<gpu>" really starts in node 1's memory. Copies are the
synchronous cuMemcpyHtoD/DtoH/Peer calls, timed one by one from a thread pinned to the
buffer's node. Without the bindings, a driver or a GPU the backend refuses to open with
ProbeUnavailable saying which, and topod carries on with the other backends.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from typing import Any

from topod.probe.backend import LinkId, ProbeResult, ProbeSizes, ProbeUnavailable, median, node_end
from topod.probe.hostmem import load_allocator, run_pinned

DEFAULT_SIZES = ProbeSizes(small_bytes=4096, small_reps=32, large_bytes=32 << 20, large_reps=3)
CU_MEMHOSTREGISTER_PORTABLE = 0x01


def load_driver() -> Any:
    """The cuda-python driver module; ProbeUnavailable when it is not installed."""
    try:
        from cuda.bindings import driver  # cuda-bindings >= 12.6
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore[no-redef]  # cuda-python < 12.6
        except ImportError as exc:
            raise ProbeUnavailable("cuda-python is not installed (pip install 'topod[cuda]')") from exc
    return driver


def normalize_bus_id(text: str) -> str:
    """'00000000:3B:00.0' or '0000:3b:00.0' -> '0000:3b:00.0' (sysfs spelling)."""
    domain, bus, rest = text.strip().strip("\x00").lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


def cuda_unavailable_reason() -> str | None:
    """None when CUDA can be used here, else why not (for `topoctl links` and the bench)."""
    try:
        driver = load_driver()
        _check(driver, "cuInit", driver.cuInit(0))
        count = _check(driver, "cuDeviceGetCount", driver.cuDeviceGetCount())
    except ProbeUnavailable as exc:
        return str(exc)
    except RuntimeError as exc:  # the bindings raise when libcuda.so itself is missing
        return f"no NVIDIA driver: {exc}"
    return None if count else "the driver sees no GPU"


def _check(driver: Any, call: str, answer: Any) -> Any:
    """cuda-python returns (CUresult, value...) tuples; raise on an error, unwrap the value."""
    err, *values = answer if isinstance(answer, tuple) else (answer,)
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)
        text = name[1].decode() if isinstance(name, tuple) and len(name) > 1 and name[1] else str(err)
        raise ProbeUnavailable(f"{call} failed: {text}")
    return values[0] if len(values) == 1 else tuple(values) if values else None


@dataclass(slots=True)
class _Device:
    address: str
    handle: Any
    context: Any
    buffer: int  # device pointer, large_bytes
    peer_buffer: int  # second device buffer: the peer-copy destination


@dataclass(slots=True)
class CudaBackend:
    driver: Any
    devices: dict[str, _Device]
    host_buffers: dict[int, tuple[int, Any]]  # node -> (address, allocator handle)
    node_cpus: dict[int, tuple[int, ...]]
    sizes: ProbeSizes
    allocator: Any
    name: str = "cuda"
    _peers: dict[tuple[str, str], bool] = field(default_factory=dict)

    @classmethod
    def open(cls, topology, sizes: ProbeSizes | None = None) -> CudaBackend:  # noqa: ANN001
        driver = load_driver()
        try:
            _check(driver, "cuInit", driver.cuInit(0))
        except RuntimeError as exc:
            raise ProbeUnavailable(f"no NVIDIA driver: {exc}") from exc
        sizes = sizes or DEFAULT_SIZES
        wanted = {gpu.address for gpu in topology.gpus}
        allowed = os.sched_getaffinity(0)
        node_cpus = {n.id: tuple(c for c in n.cpus if c in allowed) for n in topology.numa_nodes}
        allocator = load_allocator(len(topology.numa_nodes))
        backend = cls(driver, {}, {}, {n: c for n, c in node_cpus.items() if c}, sizes, allocator)
        try:
            for ordinal in range(_check(driver, "cuDeviceGetCount", driver.cuDeviceGetCount())):
                handle = _check(driver, "cuDeviceGet", driver.cuDeviceGet(ordinal))
                raw = _check(driver, "cuDeviceGetPCIBusId", driver.cuDeviceGetPCIBusId(32, handle))
                address = normalize_bus_id(raw.decode() if isinstance(raw, bytes) else str(raw))
                if address in wanted:
                    backend._open_device(address, handle)
            if not backend.devices:
                raise ProbeUnavailable("the driver sees none of the topology's GPUs")
            for node in (n.id for n in topology.numa_nodes if n.memory_bytes != 0):
                backend._pin_host_buffer(node)
        except BaseException:
            backend.close()
            raise
        return backend

    def _open_device(self, address: str, handle: Any) -> None:
        d = self.driver
        context = _check(d, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(handle))
        _check(d, "cuCtxSetCurrent", d.cuCtxSetCurrent(context))
        buffer = int(_check(d, "cuMemAlloc", d.cuMemAlloc(self.sizes.large_bytes)))
        peer = int(_check(d, "cuMemAlloc", d.cuMemAlloc(self.sizes.large_bytes)))
        self.devices[address] = _Device(address, handle, context, buffer, peer)

    def _pin_host_buffer(self, node: int) -> None:
        address, handle = self.allocator.alloc(self.sizes.large_bytes, node)
        ctypes.memset(address, 1, self.sizes.large_bytes)  # place the pages before pinning
        _check(self.driver, "cuMemHostRegister",
               self.driver.cuMemHostRegister(address, self.sizes.large_bytes, CU_MEMHOSTREGISTER_PORTABLE))
        self.host_buffers[node] = (address, handle)

    def links(self) -> list[LinkId]:
        out = []
        for node in sorted(self.host_buffers):
            for address in sorted(self.devices):
                out += [LinkId("h2d", node_end(node), address), LinkId("d2h", address, node_end(node))]
        addresses = sorted(self.devices)
        for i, a in enumerate(addresses):
            out += [LinkId("p2p", a, b) for b in addresses[i + 1:] if self._can_peer(a, b)]
        return out

    def _can_peer(self, a: str, b: str) -> bool:
        d = self.driver
        x, y = self.devices[a].handle, self.devices[b].handle
        return bool(_check(d, "cuDeviceCanAccessPeer", d.cuDeviceCanAccessPeer(x, y))
                    and _check(d, "cuDeviceCanAccessPeer", d.cuDeviceCanAccessPeer(y, x)))

    def measure(self, link: LinkId) -> ProbeResult:
        started, wall = time.perf_counter(), time.time()
        if link.kind in ("h2d", "d2h"):
            node, device = link.host_node, self.devices.get(link.device or "")
            if node not in self.host_buffers or device is None:
                raise ProbeUnavailable(f"{link}: no pinned buffer on that node or no such GPU")
            cpus = self.node_cpus.get(node) or tuple(sorted(os.sched_getaffinity(0)))
            copy = self._host_copy(link.kind, device, self.host_buffers[node][0])
            latency, bandwidth = run_pinned(cpus, lambda: self._time(device.context, copy))
            note = f"pinned buffer on node {node} ({self.allocator.binding})"
        elif link.kind == "p2p":
            src, dst = self.devices.get(link.src), self.devices.get(link.dst)
            if src is None or dst is None:
                raise ProbeUnavailable(f"{link}: no such GPU")
            self._enable_peer(src, dst)
            d = self.driver

            def copy(size: int) -> None:
                _check(d, "cuMemcpyPeer", d.cuMemcpyPeer(dst.peer_buffer, dst.context, src.buffer, src.context, size))
                _check(d, "cuCtxSynchronize", d.cuCtxSynchronize())

            latency, bandwidth = self._time(src.context, copy)
            note = "peer copy"
        else:
            raise ProbeUnavailable(f"{link}: the CUDA backend measures h2d, d2h and p2p links")
        return ProbeResult(link, latency * 1e6, bandwidth / 1e9, self.sizes, time.perf_counter() - started,
                           self.sizes.bytes_per_link, wall, self.name, note)

    def _host_copy(self, kind: str, device: _Device, host: int):  # noqa: ANN202
        d = self.driver
        if kind == "h2d":
            return lambda size: _check(d, "cuMemcpyHtoD", d.cuMemcpyHtoD(device.buffer, host, size))
        return lambda size: _check(d, "cuMemcpyDtoH", d.cuMemcpyDtoH(host, device.buffer, size))

    def _time(self, context: Any, copy) -> tuple[float, float]:  # noqa: ANN001
        """(median small-copy seconds, median large-copy bytes/s) in the calling thread."""
        _check(self.driver, "cuCtxSetCurrent", self.driver.cuCtxSetCurrent(context))
        s = self.sizes
        copy(s.large_bytes)  # warm-up: first touch, TLB and peer mappings
        small = []
        for _ in range(s.small_reps):
            t0 = time.perf_counter()
            copy(s.small_bytes)
            small.append(time.perf_counter() - t0)
        rates = []
        for _ in range(s.large_reps):
            t0 = time.perf_counter()
            copy(s.large_bytes)
            rates.append(s.large_bytes / max(1e-9, time.perf_counter() - t0))
        return median(small), median(rates)

    def _enable_peer(self, src: _Device, dst: _Device) -> None:
        key = (src.address, dst.address)
        if self._peers.get(key):
            return
        d = self.driver
        for a, b in ((src, dst), (dst, src)):
            _check(d, "cuCtxSetCurrent", d.cuCtxSetCurrent(a.context))
            err = d.cuCtxEnablePeerAccess(b.context, 0)
            err = err[0] if isinstance(err, tuple) else err
            if err not in (d.CUresult.CUDA_SUCCESS, d.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
                _check(d, "cuCtxEnablePeerAccess", (err,))
        self._peers[key] = True

    def close(self) -> None:
        d = self.driver
        for address, handle in self.host_buffers.values():
            d.cuMemHostUnregister(address)
            self.allocator.free(address, self.sizes.large_bytes, handle)
        self.host_buffers.clear()
        for device in self.devices.values():
            d.cuCtxSetCurrent(device.context)
            d.cuMemFree(device.buffer)
            d.cuMemFree(device.peer_buffer)
            d.cuDevicePrimaryCtxRelease(device.handle)
        self.devices.clear()
