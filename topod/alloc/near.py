"""What a request's `near` names on this host (pure): a device by its kernel name (nvme1,
mlx5_0, eth0; an NVMe namespace or partition names its controller), a PCI function by
its address, or a NUMA node (node:N) -> the node whose CPUs are near it and the device's
PCIe local CPUs.

Its own module because naming a device is a question about the host alone, asked before
anything about what is free: a `near` that names nothing is refused on any free state
(unknown_device, 400, never retryable), with the names the host has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topod.errors import AllocationError
from topod.model import PciDevice, Topology

NAMES_SHOWN = 24  # an error lists at most this many of the host's device names
KIND_ORDER = ("nvme", "nic", "rdma", "storage", "gpu")
NVME_PART = re.compile(r"^(nvme[0-9]+)n[0-9]+(?:p[0-9]+)?$")


class UnknownDeviceError(AllocationError):
    """`near` names no device or node of this host, or one whose NUMA node is unknown."""

    code = "unknown_device"
    retryable = False


@dataclass(frozen=True, slots=True)
class Near:
    text: str  # as the request gave it
    node: int  # the NUMA node with CPUs the lease's cores come from first
    local_cpus: frozenset[int]  # the device's PCIe local CPUs (preferred within the node); empty for node:N
    what: str  # for reasons: "nvme1 (0000:81:00.0, node 1)"


def resolve_near(topology: Topology, near: str) -> Near:
    """`near` (normalised by topod.alloc.request) -> Near; UnknownDeviceError otherwise."""
    if near.startswith("node:"):
        node_id = int(near[5:])
        node = topology.node(node_id)
        if node is None:
            nodes = ", ".join(f"node:{n.id}" for n in topology.numa_nodes)
            raise UnknownDeviceError(f"near: no NUMA node {node_id} on this host (nodes: {nodes or 'none'})")
        home = _cpu_node(topology, node_id)
        if home is None:
            raise UnknownDeviceError(f"near: node {node_id} has no CPUs and no CPU node nearest it is known")
        return Near(near, home, frozenset(), f"node {node_id}" + ("" if home == node_id else f" (CPUs of node {home})"))
    device = _device(topology, near)
    if device is None:
        raise UnknownDeviceError(f"near: no device {near!r} on this host; {_known(topology)}")
    node = device.numa_node
    if node is None:
        nodes = {cpu.numa_node for cpu in topology.cpus if cpu.id in set(device.local_cpus)} - {None}
        node = nodes.pop() if len(nodes) == 1 else None
    home = _cpu_node(topology, node) if node is not None else None
    if home is None:
        raise UnknownDeviceError(f"near: the NUMA node of {near} ({device.address}) is unknown (the firmware says "
                                 "-1 and its local CPUs do not name one node); name a node instead: node:N")
    label = near if near == device.address else f"{near} ({device.address})"
    return Near(near, home, frozenset(device.local_cpus), f"{label}, node {home}")


def _device(topology: Topology, near: str) -> PciDevice | None:
    for device in topology.pci_devices:
        if device.address == near:
            return device
    part = NVME_PART.match(near)
    names = (near, part.group(1)) if part else (near,)
    for name in names:
        for device in topology.pci_devices:
            if name in device.names:
                return device
    return None


def _cpu_node(topology: Topology, node_id: int) -> int | None:
    """The node itself when it has CPUs; a memory-only node's nearest CPU node (its first
    initiator, else the nearest by SLIT)."""
    node = topology.node(node_id)
    if node is None:
        return None
    if node.has_cpus:
        return node_id
    for initiator in node.initiators:
        other = topology.node(initiator)
        if other is not None and other.has_cpus:
            return initiator
    with_cpus = [n for n in topology.numa_nodes if n.has_cpus and n.id in node.distances]
    return min(with_cpus, key=lambda n: (node.distances[n.id], n.id)).id if with_cpus else None


def _known(topology: Topology) -> str:
    """What `near` can name here, for an error: device names by kind (storage and network
    first, the usual reasons to ask), then the nodes."""
    by_kind: dict[str, set[str]] = {}
    for device in topology.pci_devices:
        if device.names:
            by_kind.setdefault(device.kind, set()).update(device.names)
    kinds = sorted(by_kind, key=lambda kind: (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind))
    parts, shown = [], 0
    for kind in kinds:
        names = sorted(by_kind[kind])[:max(0, NAMES_SHOWN - shown)]
        if names:
            parts.append(f"{kind} {', '.join(names)}")
        shown += len(names)
    hidden = sum(len(names) for names in by_kind.values()) - shown
    listed = "; ".join(parts) + (f"; and {hidden} more" if hidden > 0 else "")
    nodes = ", ".join(f"node:{n.id}" for n in topology.numa_nodes)
    return (f"devices: {listed or 'none with a kernel name'}; or a PCI address (topoctl topo lists them); "
            f"or a node: {nodes or 'none'}")
