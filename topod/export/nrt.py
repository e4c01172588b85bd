"""Kubernetes NodeResourceTopology (topology.node.k8s.io/v1alpha2) from the host model.

One zone per NUMA node (type "Node", name "node-<id>"), `costs` from the SLIT row,
`resources` for cpu, memory, huge pages (hugepages-2Mi, hugepages-1Gi: bytes, as the kubelet
counts them), GPUs and, when NICs are leased exclusively ([alloc] nics = "exclusive"), RDMA
NIC ports (`topod.io/rdma-nic`: capacity every port of the zone's RDMA functions, allocatable
the ACTIVE ones topod hands out, available those no lease holds; with shared or none a NIC is
not a countable resource, so none is published), and `attributes` for what NRT has no field for:
NVLink/NVSwitch islands, PCIe switch groups, each GPU's level to every other GPU, and
the cluster labels (rack, leaf). The scheduler-plugins NodeResourceTopologyMatch plugin
reads the zones and the top-level `topologyManagerPolicy`/`topologyManagerScope`
attributes; those must mirror the kubelet's own settings, so they are inputs (the CLI reads
them from the kubelet's config file, topod.export.kubelet), and the defaults are the
kubelet's defaults (policy none, scope container).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from topod.cpulist import format_cpulist
from topod.discover.fabric import nvlink_domain_attributes
from topod.distance import DistanceModel
from topod.errors import ConfigError
from topod.model import Gpu, NumaNode, Topology

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
ATTR_PREFIX = "topod.io/"
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")
# The deprecated v1alpha2 `topologyPolicies` enum, still read by older scheduler plugins.
_LEGACY_POLICY = {
    ("none", "container"): "None",
    ("none", "pod"): "None",
    ("best-effort", "container"): "BestEffortContainerLevel",
    ("best-effort", "pod"): "BestEffortPodLevel",
    ("restricted", "container"): "RestrictedContainerLevel",
    ("restricted", "pod"): "RestrictedPodLevel",
    ("single-numa-node", "container"): "SingleNUMANodeContainerLevel",
    ("single-numa-node", "pod"): "SingleNUMANodePodLevel",
}


AMD_GPU_RESOURCE = "amd.com/gpu"  # ROCm's Kubernetes device plugin
NVIDIA_GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class NrtSettings:
    """What the exporter cannot discover: the kubelet's policy and the resource name."""

    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    gpu_resource: str = "nvidia.com/gpu"
    nic_resource: str = "topod.io/rdma-nic"  # RDMA NIC ports, published only when leased exclusively
    topology_manager_source: str | None = None  # kubelet-config | default | option: published when set

    def __post_init__(self) -> None:
        if self.topology_manager_policy not in POLICIES:
            raise ConfigError(
                f"export.nrt.topology_manager_policy: {self.topology_manager_policy!r} is not one of "
                f"{', '.join(POLICIES)} (copy the kubelet's --topology-manager-policy)"
            )
        if self.topology_manager_scope not in SCOPES:
            raise ConfigError(
                f"export.nrt.topology_manager_scope: {self.topology_manager_scope!r} is not one of "
                f"{', '.join(SCOPES)} (copy the kubelet's --topology-manager-scope)"
            )
        for key, value, example in (("gpu_resource", self.gpu_resource, "nvidia.com/gpu"),
                                    ("nic_resource", self.nic_resource, "topod.io/rdma-nic")):
            if "/" not in value:
                raise ConfigError(
                    f"export.nrt.{key}: {value!r} is not an extended resource name "
                    f"(expected vendor/name, e.g. {example})"
                )


def build_nrt(
    topology: Topology,
    node_name: str,
    *,
    leased_gpus: Iterable[int] = (),
    leased_cpus: Iterable[int] = (),
    reserved_cpus: Iterable[int] = (),
    reserved_memory: Mapping[int, int] | None = None,
    labels: Mapping[str, str] | None = None,
    settings: NrtSettings | None = None,
    distances: DistanceModel | None = None,
    nic_mode: str = "shared",
    leased_nics: Iterable[str] = (),
) -> dict[str, object]:
    """The NodeResourceTopology object for this host, ready to serialise as YAML or JSON.

    nic_mode: [alloc] nics; leased_nics: keys (`<PCI address>/<port>`) of the NIC ports
    leases hold, counted only when nic_mode is exclusive."""
    if not node_name:
        raise ConfigError("export nrt: a node name is required (the Kubernetes Node's name)")
    check_node_name(node_name)
    settings = _vendor_resource(settings or NrtSettings(), topology)
    model = distances or DistanceModel(topology)
    leased_gpu_set = set(leased_gpus)
    unknown = sorted(leased_gpu_set - {gpu.index for gpu in topology.gpus})
    if unknown:
        raise ConfigError(f"export nrt: leased GPUs {unknown} are not on this host")
    nic_ports = _nic_ports(topology, nic_mode, leased_nics)
    withheld = set(reserved_cpus) | set(topology.isolated_cpus)
    leased = set(leased_cpus)
    zones = [
        _zone(topology, node, model, settings, withheld, leased, leased_gpu_set, reserved_memory or {}, nic_ports)
        for node in sorted(topology.numa_nodes, key=lambda n: n.id)
    ]
    policy, scope = settings.topology_manager_policy, settings.topology_manager_scope
    attributes = [
        _attr("topologyManagerPolicy", policy),
        _attr("topologyManagerScope", scope),
        *([_attr(ATTR_PREFIX + "topology-manager-source", settings.topology_manager_source)]
          if settings.topology_manager_source else []),
        *_host_attributes(topology, labels or {}),
        *_nic_host_attributes(topology, nic_ports),
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": node_name},
        "topologyPolicies": [_LEGACY_POLICY[(policy, scope)]],
        "attributes": attributes,
        "zones": zones,
    }


# A Node's name is a DNS subdomain (RFC 1123): what the API server takes as metadata.name.
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NODE_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
NODE_NAME_MAX = 253


def check_node_name(name: str) -> None:
    """ConfigError unless `name` can be a Kubernetes Node's name."""
    if len(name) > NODE_NAME_MAX or not _NODE_NAME.fullmatch(name):
        raise ConfigError(f"export nrt: {name!r} is not a Kubernetes Node name (an RFC 1123 subdomain: lowercase "
                          f"letters, digits, '-' and '.', at most {NODE_NAME_MAX}); pass --node-name")


def zone_name(node_id: int) -> str:
    return f"node-{node_id}"


def _zone(
    topology: Topology,
    node: NumaNode,
    model: DistanceModel,
    settings: NrtSettings,
    withheld: set[int],
    leased: set[int],
    leased_gpus: set[int],
    reserved_memory: Mapping[int, int],
    nic_ports: list[_NicPort] | None = None,
) -> dict[str, object]:
    cpus = set(node.cpus)
    allocatable = cpus - withheld
    resources = [_resource("cpu", len(cpus), len(allocatable), len(allocatable - leased))]
    if node.memory_bytes is not None:
        # topod leases no memory, so available is what the kubelet may hand out; as in the
        # kubelet's allocatable, the huge page pools are not ordinary memory.
        free = max(0, node.memory_bytes - reserved_memory.get(node.id, 0) - hugepage_bytes(node))
        resources.append(_resource("memory", node.memory_bytes, free, free))
    resources.extend(hugepage_resources(node))
    gpus = [gpu for gpu in topology.gpus if gpu.numa_node == node.id]
    if gpus:
        free_gpus = sum(1 for gpu in gpus if gpu.index not in leased_gpus)
        resources.append(_resource(settings.gpu_resource, len(gpus), len(gpus), free_gpus))
    ports = [port for port in nic_ports or () if port.node == node.id]
    if ports:
        active = [port for port in ports if port.active]
        resources.append(_resource(settings.nic_resource, len(ports), len(active),
                                   sum(1 for port in active if not port.leased)))
    zone: dict[str, object] = {
        "name": zone_name(node.id),
        "type": "Node",
        "costs": [{"name": zone_name(other), "value": int(cost)} for other, cost in sorted(node.distances.items())],
        "resources": resources,
    }
    attributes = _zone_attributes(topology, node, model, gpus, withheld & cpus)
    if ports:
        attributes.append(_attr(ATTR_PREFIX + "rdma-nics", ",".join(port.name for port in ports)))
    if attributes:
        zone["attributes"] = attributes
    return zone


@dataclass(frozen=True, slots=True)
class _NicPort:
    name: str  # mlx5_0:1
    node: int | None
    active: bool
    leased: bool


def _nic_ports(topology: Topology, mode: str, leased: Iterable[str]) -> list[_NicPort]:
    """Every RDMA port with its zone, when NICs are leased exclusively; [] otherwise (a
    shared NIC is no countable resource, and none means topod hands out no NIC)."""
    from topod.alloc.nics import NIC_MODES, nic_key

    if mode not in NIC_MODES:
        raise ConfigError(f"export nrt: [alloc] nics {mode!r} is not one of {', '.join(NIC_MODES)}")
    if mode != "exclusive":
        return []  # shared leases' NICs count for nothing here, known or not
    held = set(leased)
    ports = [(nic_key(device.address, port.port), device, port) for device in topology.devices_of_kind("rdma")
             for port in device.rdma_ports]
    unknown = sorted(held - {key for key, _, _ in ports})
    if unknown:
        raise ConfigError(f"export nrt: leased NIC ports {', '.join(unknown)} are not on this host "
                          "(expected <PCI address>/<port> of an RDMA function)")
    return [_NicPort(f"{port.device}:{port.port}", device.numa_node, port.active, key in held)
            for key, device, port in ports]


def _nic_host_attributes(topology: Topology, ports: list[_NicPort]) -> list[dict[str, str]]:
    """Which ports fit no zone (no known NUMA node): said, never guessed into one."""
    zones = {node.id for node in topology.numa_nodes}
    homeless = [port.name for port in ports if port.node is None or port.node not in zones]
    return [_attr(ATTR_PREFIX + "rdma-nics-without-zone", ",".join(homeless))] if homeless else []


_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def binary_quantity(value: int) -> str:
    """Bytes as Kubernetes' canonical binary Quantity (the largest suffix that divides
    exactly): 2097152 -> '2Mi', 1073741824 -> '1Gi', 65536 -> '64Ki', 1536 -> '1536'."""
    suffix = ""
    for candidate in _BINARY_SUFFIXES:
        if value == 0 or value % 1024:
            break
        value //= 1024
        suffix = candidate
    return f"{value}{suffix}"


def hugepage_resource_name(size_kib: int) -> str:
    """The kubelet's name for a page size: 2048 KiB -> 'hugepages-2Mi', 1048576 -> 'hugepages-1Gi'."""
    return f"hugepages-{binary_quantity(size_kib * 1024)}"


def hugepage_bytes(node: NumaNode) -> int:
    """Bytes the node's huge page pools hold (all sizes)."""
    return sum(size * 1024 * pool.total for size, pool in node.hugepages.items())


def hugepage_resources(node: NumaNode) -> list[dict[str, object]]:
    """One resource per page size, in bytes as the kubelet counts them: capacity and
    allocatable the pool, available its free pages (pages in use are not available)."""
    resources = []
    for size, pool in sorted(node.hugepages.items()):
        total, free = size * 1024 * pool.total, size * 1024 * min(pool.free, pool.total)
        resources.append(_resource(hugepage_resource_name(size), total, total, free))
    return resources


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, object]:
    return {"name": name, "capacity": capacity, "allocatable": allocatable, "available": available}


def _attr(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def _zone_attributes(
    topology: Topology, node: NumaNode, model: DistanceModel, gpus: list[Gpu], withheld: set[int]
) -> list[dict[str, str]]:
    attributes: list[dict[str, str]] = []
    if not node.has_cpus:
        attributes.append(_attr(ATTR_PREFIX + "memory-only", "true"))
    if withheld:
        attributes.append(_attr(ATTR_PREFIX + "withheld-cpus", format_cpulist(sorted(withheld))))
    if gpus:
        attributes.append(_attr(ATTR_PREFIX + "gpus", ",".join(str(g.index) for g in gpus)))
    order = [gpu.index for gpu in topology.gpus]
    for gpu in gpus:
        levels = ",".join(model.gpus(gpu.index, other).label for other in order)
        attributes.append(_attr(f"{ATTR_PREFIX}gpu{gpu.index}-bus", gpu.address))
        attributes.append(_attr(f"{ATTR_PREFIX}gpu{gpu.index}-levels", levels))
    return attributes


def _host_attributes(topology: Topology, labels: Mapping[str, str]) -> list[dict[str, str]]:
    attributes = [_attr(f"{ATTR_PREFIX}cluster.{key}", value) for key, value in sorted(labels.items())]
    fabric = topology.nvlink
    attributes.extend(_attr(ATTR_PREFIX + name, value) for name, value in nvlink_domain_attributes(topology))
    if topology.gpus:
        attributes.append(_attr(ATTR_PREFIX + "gpu-order", ",".join(str(g.index) for g in topology.gpus)))
        attributes.append(_attr(ATTR_PREFIX + "nvlink-source", fabric.source))
    if fabric.islands:
        islands = ";".join(format_cpulist(list(island)) for island in fabric.islands)
        attributes.append(_attr(ATTR_PREFIX + "nvswitch-islands", islands))
        links = ",".join(f"{g}:{fabric.island_links.get(g, 0)}" for island in fabric.islands for g in island)
        attributes.append(_attr(ATTR_PREFIX + "nvswitch-links", links))
    if fabric.pairs:
        pairs = ",".join(f"{a}-{b}:{n}" for (a, b), n in sorted(fabric.pairs.items()))
        attributes.append(_attr(ATTR_PREFIX + "nvlink-pairs", pairs))
    if fabric.hives:
        attributes.append(_attr(ATTR_PREFIX + "xgmi-hives", ";".join(format_cpulist(list(h)) for h in fabric.hives)))
    if topology.gpus and any(gpu.vendor not in (None, "nvidia") for gpu in topology.gpus):
        # Which vendor and model each GPU is, where the host is not NVIDIA's alone.
        attributes.append(_attr(ATTR_PREFIX + "gpu-models", ";".join(f"{gpu.index}:{gpu.vendor}:{gpu.model or ''}"
                                                                     for gpu in topology.gpus)))
    groups = pcie_switch_groups(topology)
    if groups:
        attributes.append(_attr(ATTR_PREFIX + "pcie-switch-groups", ";".join(",".join(map(str, g)) for g in groups)))
    homeless = [gpu.index for gpu in topology.gpus if gpu.numa_node is None or topology.node(gpu.numa_node) is None]
    if homeless:
        # A GPU with no known NUMA node fits no zone; say so rather than guess one.
        attributes.append(_attr(ATTR_PREFIX + "gpus-without-zone", ",".join(map(str, homeless))))
    return attributes


def _vendor_resource(settings: NrtSettings, topology: Topology) -> NrtSettings:
    """The default resource name follows the host's GPUs: AMD's device plugin counts
    amd.com/gpu; a name the operator set is kept as set."""
    if (settings.gpu_resource == NVIDIA_GPU_RESOURCE and topology.gpus
            and all(gpu.vendor == "amd" for gpu in topology.gpus)):
        return replace(settings, gpu_resource=AMD_GPU_RESOURCE)
    return settings


def pcie_switch_groups(topology: Topology) -> list[list[int]]:
    """GPU indices grouped by the PCIe switch above them (GPUs under no switch are left out)."""
    groups: dict[str, list[int]] = {}
    for gpu in topology.gpus:
        device = topology.device(gpu.address)
        if device is not None and device.switch is not None:
            groups.setdefault(device.switch, []).append(gpu.index)
    return [sorted(members) for _, members in sorted(groups.items())]
