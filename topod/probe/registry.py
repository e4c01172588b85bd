"""Which probe backend a spec names. Kept apart from backend.py, which every backend
imports, so the registry can import the backends without a cycle."""

from __future__ import annotations

from topod.probe.backend import ProbeBackend


def open_backend(spec: str, topology, **options) -> ProbeBackend:  # noqa: ANN001 - Topology, lazily typed
    """'host-memory' | 'cuda' | 'simulated:<file>' -> a backend for topology.
    Imports lazily: the CUDA bindings load only when asked for."""
    from topod.errors import ConfigError

    if spec == "host-memory":
        from topod.probe.hostmem import HostMemoryBackend

        return HostMemoryBackend.from_topology(topology, **options)
    if spec == "cuda":
        from topod.probe.cuda import CudaBackend

        return CudaBackend.open(topology, **options)
    if spec.startswith("simulated:"):
        from topod.probe.simulated import SimulatedBackend

        path = spec.split(":", 1)[1]
        if not path:
            raise ConfigError("probe backend 'simulated:' needs a ground-truth table file: simulated:<file>")
        return SimulatedBackend.from_file(path, topology, **options)
    raise ConfigError(f"probe.backend {spec!r}: expected host-memory, cuda or simulated:<file>")
