"""The human view of a Topology: a tree (NUMA -> root complex -> switch -> device) and a
device matrix like `nvidia-smi topo -m`."""

from __future__ import annotations

from topod.cpulist import format_cpulist
from topod.distance import DistanceModel
from topod.model import PciDevice, Topology
from topod.topojson import matrix_devices

SHOWN_KINDS = ("gpu", "nvswitch", "rdma", "nic", "nvme", "other")


def render_topology(topology: Topology, model: DistanceModel | None = None) -> str:
    model = model or DistanceModel(topology)
    lines = [f"host {topology.root}: {len(topology.numa_nodes)} NUMA node(s), "
             f"{len(topology.online_cpus)} online CPU(s), {len(topology.gpus)} GPU(s)"]
    if topology.isolated_cpus:
        lines.append(f"isolated CPUs: {format_cpulist(topology.isolated_cpus)}")
    if topology.nohz_full_cpus:
        lines.append(f"nohz_full CPUs: {format_cpulist(topology.nohz_full_cpus)}")
    lines.extend(_tree(topology))
    matrix = _matrix(topology, model)
    if matrix:
        lines.append("")
        lines.extend(matrix)
        lines.append("Legend: X self, NV# NVLink links, NVS# NVSwitch island (# links per GPU), PIX one PCIe "
                     "switch, PXB several switches, PHB host bridge, NODE same NUMA node, SYS across nodes")
    if topology.warnings:
        lines.append("")
        lines.append(f"warnings ({len(topology.warnings)}):")
        lines.extend(f"  [{w.code}] {w.path}: {w.reason}" for w in topology.warnings)
    return "\n".join(lines) + "\n"


def _tree(topology: Topology) -> list[str]:
    gpu_of = {gpu.address: gpu for gpu in topology.gpus}
    lines: list[str] = []
    by_node: dict[int | None, list[PciDevice]] = {}
    for device in topology.pci_devices:
        by_node.setdefault(device.numa_node, []).append(device)
    for node in topology.numa_nodes:
        memory = f", {node.memory_bytes / 2**30:.0f} GiB" if node.memory_bytes else ""
        kind = "" if node.has_cpus else " (memory only)"
        lines.append(f"NUMA node {node.id}{kind}: CPUs {format_cpulist(node.cpus) or '-'}{memory}")
        lines.extend(_node_devices(by_node.get(node.id, []), gpu_of))
    unknown = by_node.get(None, [])
    if unknown:
        lines.append("NUMA node unknown (firmware gives no locality):")
        lines.extend(_node_devices(unknown, gpu_of))
    return lines


def _node_devices(devices: list[PciDevice], gpu_of: dict) -> list[str]:
    lines: list[str] = []
    shown = [d for d in devices if d.kind in SHOWN_KINDS]
    for complex_name in sorted({d.root_complex for d in shown}):
        lines.append(f"  root complex {complex_name}")
        members = [d for d in shown if d.root_complex == complex_name]
        for switch in sorted({d.switch for d in members if d.switch}):
            lines.append(f"    PCIe switch {switch}")
            lines.extend(f"      {_describe(d, gpu_of)}" for d in members if d.switch == switch)
        lines.extend(f"    {_describe(d, gpu_of)}" for d in members if not d.switch)
    return lines


def _describe(device: PciDevice, gpu_of: dict) -> str:
    gpu = gpu_of.get(device.address)
    label = f"GPU{gpu.index} {gpu.name or ''}".rstrip() if gpu else device.kind
    names = f" [{', '.join(device.names)}]" if device.names else ""
    link = ""
    if device.link and device.link.current_speed:
        link = f" {device.link.current_speed} x{device.link.current_width}"
        if device.link.degraded:
            link += f" (DEGRADED, max {device.link.max_speed} x{device.link.max_width})"
    source = "" if device.numa_node_source in ("firmware", "single_node") else f" (node from {device.numa_node_source})"
    return f"{device.address} {label}{names}{link}{source}"


def _matrix(topology: Topology, model: DistanceModel) -> list[str]:
    rows = matrix_devices(topology)
    if len(rows) < 2 and not topology.gpus:
        return []
    width = max(6, max(len(label) for label, _ in rows) + 1)
    header = " " * width + "".join(f"{label:>{width}}" for label, _ in rows) + "  CPU affinity   NUMA"
    lines = [header]
    devices = {d.address: d for d in topology.pci_devices}
    for label, address in rows:
        cells = "".join(f"{model.between(address, other).label:>{width}}" for _, other in rows)
        device = devices.get(address)
        affinity = format_cpulist(device.local_cpus) if device else "?"
        node = device.numa_node if device and device.numa_node is not None else "?"
        lines.append(f"{label:<{width}}{cells}  {affinity:<14} {node}")
    return lines
