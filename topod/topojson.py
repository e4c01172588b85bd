"""The documented JSON form of a Topology (`topoctl topo --json`, GET /v1/topology)."""

from __future__ import annotations

from topod.distance import DistanceModel
from topod.discover.fabric import nvlink_domain
from topod.model import Topology

SCHEMA_VERSION = 1
MATRIX_KINDS = ("gpu", "rdma", "nic", "nvme")


def topology_to_json(topology: Topology, distances: DistanceModel | None = None) -> dict[str, object]:
    model = distances or DistanceModel(topology)
    return {
        "schema_version": SCHEMA_VERSION,
        "root": topology.root,
        "hostname": topology.hostname,
        "driver_version": topology.driver_version,
        "numa_nodes": [node.to_json() for node in topology.numa_nodes],
        "cpus": [cpu.to_json() for cpu in topology.cpus],
        "isolated_cpus": list(topology.isolated_cpus),
        "nohz_full_cpus": list(topology.nohz_full_cpus),
        "pci_devices": [device.to_json() for device in topology.pci_devices],
        "gpus": [gpu.to_json() for gpu in topology.gpus],
        "nvlink": topology.nvlink.to_json(),
        "nvlink_domain": nvlink_domain(topology.gpus),
        "gpu_numa_distances": gpu_numa_distances(topology, model),
        "pcie_switches": pcie_switches(topology),
        "distance_matrix": distance_matrix(topology, model),
        "warnings": [warning.to_json() for warning in topology.warnings],
    }


def matrix_devices(topology: Topology) -> list[tuple[str, str]]:
    """(label, address) of the devices the matrix shows: GPUs by index, then NICs and NVMe."""
    rows = [(f"GPU{gpu.index}", gpu.address) for gpu in topology.gpus]
    gpu_addresses = {gpu.address for gpu in topology.gpus}
    counters: dict[str, int] = {}
    for device in topology.pci_devices:
        if device.kind in ("rdma", "nic", "nvme") and device.address not in gpu_addresses:
            prefix = {"rdma": "NIC", "nic": "ETH", "nvme": "NVME"}[device.kind]
            number = counters.get(prefix, 0)
            counters[prefix] = number + 1
            rows.append((f"{prefix}{number}", device.address))
    return rows


def distance_matrix(topology: Topology, model: DistanceModel) -> dict[str, object]:
    rows = matrix_devices(topology)
    addresses = [address for _, address in rows]
    levels, weights = [], []
    for a in addresses:
        row = [model.between(a, b) for b in addresses]
        levels.append([d.label for d in row])
        weights.append([round(d.weight, 3) for d in row])
    return {"devices": [{"label": label, "address": address} for label, address in rows],
            "levels": levels, "weights": weights}


def pcie_switches(topology: Topology) -> list[dict[str, object]]:
    """Each switch: its upstream port, downstream ports, and the endpoints below it."""
    switches: dict[str, dict[str, list[str]]] = {}
    for device in topology.pci_devices:
        if device.switch is None:
            continue
        entry = switches.setdefault(device.switch, {"downstream_ports": [], "devices": []})
        if device.address == device.switch:
            continue
        if device.kind == "bridge" and device.parent == device.switch:
            entry["downstream_ports"].append(device.address)
        elif device.kind != "bridge":
            entry["devices"].append(device.address)
    return [{"upstream_port": usp, **members} for usp, members in sorted(switches.items())]


def gpu_numa_distances(topology: Topology, model: DistanceModel) -> dict[str, object]:
    """Each GPU to each NUMA node: level (C2C, PHB, SYS) and weight, nodes in id order."""
    nodes = [node.id for node in topology.numa_nodes]
    rows = [[model.gpu_to_node(gpu.index, node) for node in nodes] for gpu in topology.gpus]
    return {"gpus": [gpu.index for gpu in topology.gpus], "nodes": nodes,
            "levels": [[d.label for d in row] for row in rows],
            "weights": [[round(d.weight, 3) for d in row] for row in rows]}
