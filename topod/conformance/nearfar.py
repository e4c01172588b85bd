"""The host-to-device check of `make test-gpu`: a copy into each GPU from the NUMA node
topod places it on must be at least as fast as one from the farthest other node.

A GPU whose far copies are faster is nearer another node than topod says (firmware that
reports the wrong `numa_node`, a GPU behind another socket's root port): every lease that
pins its job beside it would pin it on the wrong socket. Any probe backend measures it
(CUDA on NVIDIA GPUs; the simulated backend in tests); a link the backend cannot measure
is reported as unchecked, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from topod.model import Topology
from topod.probe.backend import LinkId, ProbeBackend, ProbeUnavailable, node_end

# A near copy slower than the far one by more than this share is a mismatch (copies on a
# busy host vary by a few percent; a wrong socket costs 30-60 %).
TOLERANCE = 0.10


@dataclass(frozen=True, slots=True)
class NearFar:
    gpu: int
    address: str
    near_node: int
    far_node: int
    near_gbps: float
    far_gbps: float

    @property
    def mismatch(self) -> bool:
        return self.near_gbps < self.far_gbps * (1.0 - TOLERANCE)

    def line(self) -> str:
        text = (f"GPU{self.gpu} {self.address}: host-to-device from node {self.near_node} (topod's) "
                f"{self.near_gbps:.1f} GB/s, from node {self.far_node} {self.far_gbps:.1f} GB/s")
        if self.mismatch:
            return f"MISMATCH {text}: the GPU is nearer node {self.far_node} than topod says"
        return f"near/far {text}"


def farthest_node(topology: Topology, node: int) -> int | None:
    """The CPU node farthest from `node` by SLIT distance (lowest id on a tie), or None on
    a host with one CPU node."""
    others = [other for other in topology.numa_nodes if other.id != node and other.cpus]
    if not others:
        return None
    return max(others, key=lambda other: (topology.slit(node, other.id) or 0, -other.id)).id


def near_far(topology: Topology, backend: ProbeBackend) -> tuple[list[NearFar], list[str]]:
    """(each GPU's near and far copy rates, why a GPU was left unchecked)."""
    offered = set(backend.links())
    checked: list[NearFar] = []
    unchecked: list[str] = []
    for gpu in topology.gpus:
        if gpu.numa_node is None:
            unchecked.append(f"GPU{gpu.index}: topod knows no NUMA node for it")
            continue
        far = farthest_node(topology, gpu.numa_node)
        if far is None:
            unchecked.append(f"GPU{gpu.index}: one CPU node only, nothing to compare")
            continue
        links = (LinkId("h2d", node_end(gpu.numa_node), gpu.address), LinkId("h2d", node_end(far), gpu.address))
        if not all(link in offered for link in links):
            unchecked.append(f"GPU{gpu.index}: the {backend.name} backend cannot copy into it from both nodes")
            continue
        try:
            near_result, far_result = (backend.measure(link) for link in links)
        except ProbeUnavailable as exc:
            unchecked.append(f"GPU{gpu.index}: {exc}")
            continue
        checked.append(NearFar(gpu.index, gpu.address, gpu.numa_node, far,
                               near_result.bandwidth_gbps, far_result.bandwidth_gbps))
    return checked, unchecked
