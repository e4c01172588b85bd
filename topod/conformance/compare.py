"""Topod's topology against what the vendor's tool printed: one Mismatch per disagreement.

NVIDIA: GPU count, each GPU's NUMA affinity, the level of every GPU-GPU and GPU-NIC pair
(topod's NVS# prints as nvidia-smi's NV#), and that the NIC topod pairs with each GPU is
one of those nvidia-smi puts nearest. AMD: GPU count, each GPU's NUMA node, and the link
type of every pair (XGMI where topod sees xGMI, else PCIE).
"""

from __future__ import annotations

from topod.alloc.nics import pair_nics
from topod.cli.topo_text import _cell, _nic_name
from topod.conformance.smi_text import RocmTopo, SmiMatrix
from topod.distance import DistanceModel
from topod.model import Topology
from topod.record import record

LEVEL_ORDER = ("X", "C2C", "NV", "XGMI", "PIX", "PXB", "PHB", "NODE", "SYS")


@record
class Mismatch:
    what: str
    topod: str
    tool: str

    def line(self) -> str:
        return f"MISMATCH {self.what}: topod says {self.topod}, the tool says {self.tool}"


def _rank(level: str) -> int:
    head = "NV" if level.startswith("NV") else level
    return LEVEL_ORDER.index(head) if head in LEVEL_ORDER else len(LEVEL_ORDER)


def compare_nvidia(topology: Topology, smi: SmiMatrix) -> list[Mismatch]:
    gpus = [gpu for gpu in topology.gpus if gpu.vendor != "amd"]
    out: list[Mismatch] = []
    if len(gpus) != len(smi.gpus):
        return [Mismatch("NVIDIA GPU count", str(len(gpus)), str(len(smi.gpus)))]
    model = DistanceModel(topology)
    label_of = {f"GPU{i}": gpu.address for i, gpu in enumerate(gpus)}
    by_name = {_nic_name(d): d.address for d in topology.devices_of_kind("rdma", "nic")}
    for nic, name in smi.nic_names.items():
        if name in by_name:
            label_of[nic] = by_name[name]
    for i, gpu in enumerate(gpus):
        row = f"GPU{i}"
        if row in smi.numa and smi.numa[row] != gpu.numa_node:
            out.append(Mismatch(f"{row} NUMA affinity", str(gpu.numa_node), str(smi.numa[row])))
        for column in smi.labels:
            if column == row or column not in label_of:
                continue
            ours = _cell(model.between(gpu.address, label_of[column]).label).strip()
            theirs = smi.cells.get((row, column))
            if theirs is not None and ours != theirs:
                out.append(Mismatch(f"{row}-{column}", ours, theirs))
    out.extend(_nic_pairing(topology, model, gpus, smi, label_of))
    return out


def _nic_pairing(topology, model, gpus, smi: SmiMatrix, label_of: dict[str, str]) -> list[Mismatch]:
    nics = [label for label in smi.labels if label.startswith("NIC") and label in label_of]
    if not nics:
        return []
    paired, _ = pair_nics(topology, model, gpus, "shared", None)
    out = []
    for i, gpu in enumerate(gpus):
        levels = {nic: smi.cells.get((f"GPU{i}", nic), "SYS") for nic in nics}
        best = min(_rank(level) for level in levels.values())
        nearest = {label_of[nic] for nic, level in levels.items() if _rank(level) == best}
        chosen = [choice.address for choice in paired.get(gpu.index, ())]
        if chosen and chosen[0] not in nearest:
            out.append(Mismatch(f"GPU{i} NIC pairing", chosen[0], " or ".join(sorted(nearest))))
    return out


def compare_amd(topology: Topology, smi: RocmTopo) -> list[Mismatch]:
    gpus = [gpu for gpu in topology.gpus if gpu.vendor == "amd"]
    if len(gpus) != smi.count:
        return [Mismatch("AMD GPU count", str(len(gpus)), str(smi.count))]
    out = []
    model = DistanceModel(topology)
    for i, gpu in enumerate(gpus):
        if i in smi.numa and smi.numa[i] != gpu.numa_node:
            out.append(Mismatch(f"GPU{i} NUMA node", str(gpu.numa_node), str(smi.numa[i])))
        for j, other in enumerate(gpus):
            theirs = smi.link_type.get((i, j))
            if i == j or theirs is None:
                continue
            ours = "XGMI" if model.gpus(gpu.index, other.index).level == "XGMI" else "PCIE"
            if ours != theirs:
                out.append(Mismatch(f"GPU{i}-GPU{j} link type", ours, theirs))
    return out
