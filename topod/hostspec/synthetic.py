"""Synthetic large hosts (16, 32, 64 GPUs) for the allocation tests and benchmarks.

These are fixtures, not hardware anyone ships as-is: the built-in specs stop at 8 GPUs,
and the engine must be shown exact and fast well beyond that. The specs go through
topod.hostspec (so discovery reads real sysfs/NVML formats); NVSwitch islands that the
builder cannot express (it links every GPU to every switch) are set on the discovered
Topology afterwards, and the fabric's `source` says "synthetic". The daemon never
imports this module.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from topod.model import NvlinkFabric, Topology
from topod.record import replace

ISLAND_LINKS = 18  # NVLink4-class links per GPU into its island's switches


def _root_complexes(nodes: int, rcs_per_node: int, switches_per_rc: int, gpus_per_switch: int) -> list[dict]:
    # Buses spaced 0x0c apart so 16 root complexes stay below bus 0xff.
    return [
        {"node": node, "bus": 0x10 + 0x0C * (node * rcs_per_node + rc),
         "switches": [{"devices": ["gpu"] * gpus_per_switch} for _ in range(switches_per_rc)]}
        for node in range(nodes)
        for rc in range(rcs_per_node)
    ]


def spec_pcie16() -> dict:
    """2 sockets; per node 2 root complexes x 2 switches x 2 GPUs; PCIe only."""
    return {
        "name": "synthetic-pcie-16gpu", "pcie_gen": 4,
        "cpu": {"sockets": 2, "cores_per_socket": 16, "threads_per_core": 2},
        "nvml": {"model": "NVIDIA L40S", "fabric": "none", "memory_mib": 46068},
        "root_complex": _root_complexes(2, 2, 2, 2),
    }


def spec_nvswitch16() -> dict:
    """HGX-2 style: 2 sockets, 16 GPUs, 2 per switch; two NVSwitch islands of 8 (one per
    baseboard), each island split across both sockets."""
    return {
        "name": "synthetic-nvs-16gpu", "pcie_gen": 5,
        "cpu": {"sockets": 2, "cores_per_socket": 16, "threads_per_core": 2},
        "nvml": {"model": "NVIDIA H100", "fabric": "none", "memory_mib": 81559},
        "root_complex": _root_complexes(2, 2, 2, 2),
    }


def spec_32() -> dict:
    """2 sockets x NPS2 = 4 nodes; per node 2 root complexes x 1 switch x 4 GPUs."""
    return {
        "name": "synthetic-32gpu", "pcie_gen": 5,
        "cpu": {"sockets": 2, "cores_per_socket": 16, "threads_per_core": 2, "numa_per_socket": 2},
        "nvml": {"model": "NVIDIA H100", "fabric": "none", "memory_mib": 81559},
        "root_complex": _root_complexes(4, 2, 1, 4),
    }


def spec_64() -> dict:
    """4 sockets x NPS2 = 8 nodes; per node 2 root complexes x 1 switch x 4 GPUs."""
    return {
        "name": "synthetic-64gpu", "pcie_gen": 5,
        "cpu": {"sockets": 4, "cores_per_socket": 8, "threads_per_core": 2, "numa_per_socket": 2},
        "nvml": {"model": "NVIDIA H100", "fabric": "none", "memory_mib": 81559},
        "root_complex": _root_complexes(8, 2, 1, 4),
    }


# name -> (spec factory, NVSwitch island size or 0, island layout)
HOSTS: dict[str, tuple] = {
    "pcie-16gpu": (spec_pcie16, 0),
    "nvs-16gpu": (spec_nvswitch16, 8),
    "nvs-32gpu": (spec_32, 8),
    "nvs-64gpu": (spec_64, 8),
    "pcie-64gpu": (spec_64, 0),
}


def with_islands(topology: Topology, size: int, stride: int = 1) -> Topology:
    """Group GPUs into NVSwitch islands of `size`. GPUs are cut into blocks of
    size/stride consecutive indices, dealt to the islands in turn: stride 1 gives islands
    of consecutive GPUs; stride 2 makes each island take two blocks far apart (e.g. half
    its GPUs on each socket)."""
    indices = sorted(gpu.index for gpu in topology.gpus)
    count = len(indices) // size
    block = size // stride
    islands: list[list[int]] = [[] for _ in range(count)]
    for position, index in enumerate(indices):
        islands[(position // block) % count].append(index)
    fabric = NvlinkFabric(
        pairs={},
        islands=tuple(tuple(sorted(island)) for island in islands),
        island_links={index: ISLAND_LINKS for index in indices},
        source="synthetic",
    )
    return replace(topology, nvlink=fabric)


def build_synthetic(name: str, directory: str | Path | None = None) -> Topology:
    """Build the host tree under directory (a temporary one by default) and discover it."""
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host

    factory, island = HOSTS[name]
    target = Path(directory) if directory else Path(tempfile.mkdtemp(prefix=f"topod-{name}-"))
    build_host(factory(), target)
    topology = discover(HostRoot(target), live_nvml=False)
    if island:
        # nvs-16gpu: each island spans both sockets (4 GPUs from each), like HGX-2.
        stride = 2 if name == "nvs-16gpu" else 1
        topology = with_islands(topology, island, stride)
    return topology
