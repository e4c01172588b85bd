"""GPU memory exposed as NUMA nodes (Grace Hopper/Blackwell, POWER9 + V100) and the
NVLink-C2C link between such a GPU and its CPU.

Order of sources for `Gpu.memory_numa_node`: live NVML (`nvmlDeviceGetNumaNodeId`), the
nvml.json field `memory_numa_node`, else the sysfs heuristic in
`topod.discover.memory.guess_gpu_memory_nodes` (noted as a warning). A node NVML names
that sysfs does not list is ignored, with a warning.
"""

from __future__ import annotations

from topod.discover.memory import NODE_DIR, guess_gpu_memory_nodes
from topod.discover.notes import Notes
from topod.discover.nvml import NvmlReport
from topod.model import Gpu, NumaNode
from topod.record import replace


def link_gpu_memory(gpus: list[Gpu], report: NvmlReport | None, nodes: list[NumaNode],
                    notes: Notes) -> tuple[list[Gpu], list[NumaNode]]:
    """GPUs with memory node, C2C and fabric from NVML (or the heuristic); nodes with the
    `gpu` backlink."""
    node_ids = {node.id for node in nodes}
    extras = {entry.index: entry.extras for entry in report.gpus} if report is not None else {}
    linked: list[Gpu] = []
    for gpu in gpus:
        extra = extras.get(gpu.index)
        if extra is None:
            linked.append(gpu)
            continue
        memory_node = extra.memory_numa_node
        if memory_node is not None and memory_node not in node_ids:
            notes.add("bad_value", f"{NODE_DIR}/node{memory_node}",
                      f"NVML puts GPU {gpu.index}'s memory on node {memory_node}, which sysfs does not list; ignored")
            memory_node = None
        linked.append(replace(gpu, memory_numa_node=memory_node,
                              memory_numa_source=gpu.source if memory_node is not None else None,
                              c2c=extra.c2c, fabric=extra.fabric))
    guesses = guess_gpu_memory_nodes(linked, nodes, notes)
    linked = [replace(gpu, memory_numa_node=guesses[gpu.index], memory_numa_source="sysfs-heuristic")
              if gpu.index in guesses else gpu for gpu in linked]
    owner = {gpu.memory_numa_node: gpu.index for gpu in linked if gpu.memory_numa_node is not None}
    nodes = [node if node.gpu == owner.get(node.id) else replace(node, gpu=owner.get(node.id)) for node in nodes]
    return linked, nodes
