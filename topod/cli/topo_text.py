"""The human view of a Topology: a tree (NUMA -> root complex -> switch -> device) and a
device matrix in the format of `nvidia-smi topo -m` (tab-separated, the same column names
and legends, NVSwitch pairs as NV#), so tools that parse nvidia-smi's matrix parse ours."""

from __future__ import annotations

from topod.cpulist import format_cpulist
from topod.distance import DistanceModel
from topod.model import PciDevice, Topology
from topod.topojson import matrix_devices

SHOWN_KINDS = ("gpu", "nvswitch", "rdma", "nic", "nvme", "other")


def render_topology(topology: Topology, model: DistanceModel | None = None, leases: list[dict] | None = None,
                    daemon_line: str | None = None) -> str:
    model = model or DistanceModel(topology)
    lines = [f"host {topology.root}: {len(topology.numa_nodes)} NUMA node(s), "
             f"{len(topology.online_cpus)} online CPU(s), {len(topology.gpus)} GPU(s)"]
    if daemon_line:
        lines.append(daemon_line)
    if topology.isolated_cpus:
        lines.append(f"isolated CPUs: {format_cpulist(topology.isolated_cpus)}")
    if topology.nohz_full_cpus:
        lines.append(f"nohz_full CPUs: {format_cpulist(topology.nohz_full_cpus)}")
    lines.extend(_tree(topology, _lease_of_gpu(leases)))
    matrix = _matrix(topology, model)
    if matrix:
        lines.append("")
        lines.extend(matrix)
    if topology.warnings:
        lines.append("")
        lines.append(f"warnings ({len(topology.warnings)}):")
        lines.extend(f"  [{w.code}] {w.path}: {w.reason}" for w in topology.warnings)
    return "\n".join(lines) + "\n"


def render_matrix(topology: Topology, model: DistanceModel | None = None) -> str:
    """The device matrix alone with its legends, as `nvidia-smi topo -m` prints it; "" for
    a host with no GPU and fewer than two NICs (no matrix to draw)."""
    matrix = _matrix(topology, model or DistanceModel(topology))
    return "\n".join(matrix) + "\n" if matrix else ""


def _lease_of_gpu(leases: list[dict] | None) -> dict[int, str]:
    return {int(gpu): str(lease.get("id")) for lease in leases or () for gpu in lease.get("gpus", [])}


def _tree(topology: Topology, leased: dict[int, str]) -> list[str]:
    gpu_of = {gpu.address: gpu for gpu in topology.gpus}
    lines: list[str] = []
    by_node: dict[int | None, list[PciDevice]] = {}
    for device in topology.pci_devices:
        by_node.setdefault(device.numa_node, []).append(device)
    for node in topology.numa_nodes:
        memory = f", {node.memory_bytes / 2**30:.0f} GiB" if node.memory_bytes else ""
        kind = "" if node.has_cpus else " (memory only)"
        lines.append(f"NUMA node {node.id}{kind}: CPUs {format_cpulist(node.cpus) or '-'}{memory}")
        lines.extend(_node_devices(by_node.get(node.id, []), gpu_of, leased))
    unknown = by_node.get(None, [])
    if unknown:
        lines.append("NUMA node unknown (firmware gives no locality):")
        lines.extend(_node_devices(unknown, gpu_of, leased))
    return lines


def _node_devices(devices: list[PciDevice], gpu_of: dict, leased: dict[int, str]) -> list[str]:
    lines: list[str] = []
    shown = [d for d in devices if d.kind in SHOWN_KINDS]
    for complex_name in sorted({d.root_complex for d in shown}):
        lines.append(f"  root complex {complex_name or 'unknown (the function sits outside a pciDDDD:BB host bridge)'}")
        members = [d for d in shown if d.root_complex == complex_name]
        for switch in sorted({d.switch for d in members if d.switch}):
            lines.append(f"    PCIe switch {switch}")
            lines.extend(f"      {_describe(d, gpu_of, leased)}" for d in members if d.switch == switch)
        lines.extend(f"    {_describe(d, gpu_of, leased)}" for d in members if not d.switch)
    return lines


def _describe(device: PciDevice, gpu_of: dict, leased: dict[int, str]) -> str:
    gpu = gpu_of.get(device.address)
    label = f"GPU{gpu.index} {gpu.name or ''}".rstrip() if gpu else device.kind
    names = f" [{', '.join(device.names)}]" if device.names else ""
    link = ""
    if device.link and device.link.current_speed:
        link = f" {device.link.current_speed} x{device.link.current_width}"
        if device.link.degraded:
            link += f" (DEGRADED, max {device.link.max_speed} x{device.link.max_width})"
    source = "" if device.numa_node_source in ("firmware", "single_node") else f" (node from {device.numa_node_source})"
    lease = f" (leased: {leased[gpu.index]})" if gpu is not None and gpu.index in leased else ""
    return f"{device.address} {label}{names}{link}{source}{lease}"


LEGEND = (
    "Legend:",
    "",
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
)


def _cell(label: str) -> str:
    """nvidia-smi's spelling: ' X ' for self, NV# also through an NVSwitch (topod says NVS#)."""
    if label == "X":
        return " X "
    return "NV" + label[3:] if label.startswith("NVS") else label


def _nic_name(device: PciDevice) -> str:
    """The verbs device name (mlx5_0) nvidia-smi's NIC legend shows, else the first name."""
    verbs = [name for name in device.names if not name.startswith(("ib", "en", "eth"))]
    return (verbs or list(device.names) or [device.address])[0]


def _matrix(topology: Topology, model: DistanceModel) -> list[str]:
    everything = matrix_devices(topology)
    rows = [(label, address) for label, address in everything if label.startswith(("GPU", "NIC"))]
    if len(rows) < 2 and not topology.gpus:
        return []
    devices = {d.address: d for d in topology.pci_devices}
    # GPU NUMA ID: the node holding the GPU's own memory (Grace Hopper/Blackwell), as
    # nvidia-smi prints it there; N/A where GPU memory is not a NUMA node.
    memory_node = {g.address: g.memory_numa_node for g in topology.gpus if g.memory_numa_node is not None}
    labels = [label for label, _ in rows]
    lines = ["\t" + "\t".join(labels) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for label, address in rows:
        cells = "\t".join(_cell(model.between(address, other).label) for _, other in rows)
        if label.startswith("GPU"):
            device = devices.get(address)
            affinity = format_cpulist(device.local_cpus) if device and device.local_cpus else "N/A"
            node = device.numa_node if device and device.numa_node is not None else "N/A"
            lines.append(f"{label}\t{cells}\t{affinity}\t{node}\t\t{memory_node.get(address, 'N/A')}")
        else:
            lines.append(f"{label}\t{cells}")  # nvidia-smi gives NICs no affinity columns
    lines += ["", *LEGEND]
    for island in topology.nvlink.islands:
        lines.append(f"         GPUs {format_cpulist(island)} are one NVSwitch island (all-to-all): "
                     "there # is the NVLinks per GPU, the fewer of the pair")
    if topology.nvlink.xgmi:
        lines.append("  XGMI = Connection traversing AMD xGMI links (as rocm-smi --showtopo names the link type)")
    for hive in topology.nvlink.hives:
        lines.append(f"         GPUs {format_cpulist(hive)} are one xGMI hive")
    nics = [(label, devices[address]) for label, address in rows if label.startswith("NIC") and address in devices]
    if nics:
        lines += ["", "NIC Legend:", ""]
        lines += [f"  {label}: {_nic_name(device)}" for label, device in nics]
    others = [(label, address) for label, address in everything if not label.startswith(("GPU", "NIC"))]
    gpus = [(label, address) for label, address in rows if label.startswith("GPU")]
    if others and gpus:
        lines += ["", "Other devices (not in nvidia-smi's matrix), level to each GPU:", ""]
        for label, address in others:
            device = devices.get(address)
            name = f" {device.names[0]}" if device and device.names else ""
            levels = " ".join(f"{g}={_cell(model.between(address, a).label)}" for g, a in gpus)
            lines.append(f"  {label}{name} {address}: {levels}")
    return lines
