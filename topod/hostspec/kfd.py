"""The AMD side of a host spec: the KFD topology amdgpu publishes, its DRM nodes and the
amdgpu attributes on each GPU's PCI function.

What it writes follows the kernel's ABI (drivers/gpu/drm/amd/amdkfd/kfd_topology.c):
/sys/class/kfd/kfd/topology/{generation_id,system_properties,nodes/N/...}, every file
`key value` lines in decimal; CPU nodes first (one per NUMA node with CPUs), then GPU
nodes in PCI order; a GPU node's location_id is (bus << 8) | devfn and domain its PCI
domain; no NUMA key (a GPU's io_link of type 2 names its CPU node); io_links of type 2
(PCIe, weight 20) and 11 (xGMI, weight 15); drm_render_minor stepping by 8 per GPU on
MI300-class parts (the extra minors belong to amdgpu_xcp partition devices).

[kfd] in a spec: hive (xGMI all-to-all, default true), vram_gib, compute_partition
(SPX/DPX/QPX/CPX), memory_partition (NPS1/NPS2/NPS4), product_name.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence

from topod.errors import ConfigError
from topod.hostspec.pci import Function

KFD_DIR = "sys/devices/virtual/kfd/kfd"
PCIE_LINK, XGMI_LINK, CPU_LINK = 2, 11, 1  # CRAT io_link types (HyperTransport between AMD sockets)
PCIE_WEIGHT, XGMI_WEIGHT = 20, 15
XGMI_MAX_BANDWIDTH_MBS = 64000  # one MI300X xGMI link, one direction
PARTITIONS = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
MEMORY_PARTITIONS = {"NPS1": 1, "NPS2": 2, "NPS4": 4}
MINORS_PER_GPU = 8  # DRM minors amdgpu reserves per MI300-class GPU
# device id -> (gfx_target_version, CUs, product name) of the parts the fixtures build
PARTS = {
    0x74A1: (90402, 304, "AMD Instinct MI300X OAM"),
    0x74A5: (90402, 304, "AMD Instinct MI325X OAM"),
    0x75A3: (90500, 256, "AMD Instinct MI355X OAM"),
}
# /proc/cpuinfo's model name for each [cpu] identity, what KFD names a CPU node
CPU_NAMES = {"amd": "AMD EPYC 9654 96-Core Processor", "intel": "Intel(R) Xeon(R) Platinum 8480+"}

Write = Callable[[str, str], None]


def unique_id(host: str, index: int) -> int:
    """A stable 64-bit id per fixture GPU (amdgpu reads the real one from the part's fuses)."""
    return int.from_bytes(hashlib.sha1(f"{host}/amd/{index}".encode()).digest()[:8], "big") | 1


def hive_id(host: str) -> int:
    return int.from_bytes(hashlib.sha1(f"{host}/hive".encode()).digest()[:8], "big") | 1


def location_id(address: str) -> int:
    """'0000:05:00.0' -> (bus << 8) | devfn, as KFD writes it."""
    _domain, bus, slot_function = address.split(":")
    slot, function = slot_function.split(".")
    return (int(bus, 16) << 8) | (int(slot, 16) << 3) | int(function, 16)


def _properties(values: dict[str, int]) -> str:
    return "".join(f"{key} {value}\n" for key, value in values.items())


def _link(kind: int, node_from: int, node_to: int, weight: int, bandwidth: int = 0) -> str:
    return _properties({"type": kind, "version_major": 0, "version_minor": 0, "node_from": node_from,
                        "node_to": node_to, "weight": weight, "min_latency": 0, "max_latency": 0,
                        "min_bandwidth": bandwidth // 2, "max_bandwidth": bandwidth,
                        "recommended_transfer_size": 0, "flags": 1})


def write_kfd_tree(write: Write, link: Callable[[str, str], None], spec: dict, gpus: Sequence[Function],
                   cpu_nodes: dict[int, list[int]], distances: Sequence[Sequence[int]]) -> None:
    """The KFD topology, /dev/kfd, /dev/dri and amdgpu's PCI attributes for the AMD GPUs."""
    if not gpus:
        return
    kfd = spec.get("kfd", {})
    compute = str(kfd.get("compute_partition", "SPX")).upper()
    memory = str(kfd.get("memory_partition", "NPS1")).upper()
    if compute not in PARTITIONS or memory not in MEMORY_PARTITIONS:
        raise ConfigError(f"host spec [kfd]: compute_partition {compute!r} must be one of {', '.join(PARTITIONS)}"
                          f" and memory_partition {memory!r} one of {', '.join(MEMORY_PARTITIONS)}")
    host = str(spec.get("name"))
    vram = int(float(kfd.get("vram_gib", 192)) * 2**30)
    hive = hive_id(host) if kfd.get("hive", True) else 0
    partitions = PARTITIONS[compute]
    cpu_ids = [node for node, cpus in sorted(cpu_nodes.items()) if cpus]
    kfd_of_cpu = {node: number for number, node in enumerate(cpu_ids)}
    # KFD node numbers of each GPU's partitions, after the CPU nodes
    nodes_of_gpu = [[len(cpu_ids) + g * partitions + p for p in range(partitions)] for g in range(len(gpus))]
    base = f"{KFD_DIR}/topology"
    write(f"{base}/generation_id", "1\n")
    write(f"{base}/system_properties", _properties({"platform_oem": 0, "platform_id": 0, "platform_rev": 0}))
    cpu_name = CPU_NAMES.get(str(spec.get("cpu", {}).get("identity", "intel")), "")
    for node, number in kfd_of_cpu.items():
        _write_cpu_node(write, f"{base}/nodes/{number}", number, node, cpu_nodes[node], cpu_name, kfd_of_cpu,
                        distances, [(g, nodes_of_gpu[i][0]) for i, g in enumerate(gpus) if g.home_node == node])
    for index, gpu in enumerate(gpus):
        peers = [nodes[0] for other, nodes in enumerate(nodes_of_gpu) if other != index]
        for part, number in enumerate(nodes_of_gpu[index]):
            _write_gpu_node(write, f"{base}/nodes/{number}", number, gpu, index, part, host,
                            kfd_of_cpu.get(gpu.home_node, 0), peers if hive else [], hive,
                            vram // MEMORY_PARTITIONS[memory], 8 // partitions)
        _write_pci_attributes(write, link, gpu, index, host, compute, memory, vram, kfd)
    link("sys/class/kfd/kfd", os.path.relpath(KFD_DIR, "sys/class/kfd"))
    write("dev/kfd", "")


def _write_cpu_node(write: Write, path: str, number: int, node: int, cpus: list[int], name: str,
                    kfd_of_cpu: dict[int, int], distances: Sequence[Sequence[int]],
                    gpus: list[tuple[Function, int]]) -> None:
    write(f"{path}/gpu_id", "0\n")
    write(f"{path}/name", f"{name}\n")
    others = [(other, peer) for other, peer in kfd_of_cpu.items() if other != node]
    write(f"{path}/properties", _properties({
        "cpu_cores_count": len(cpus), "simd_count": 0, "mem_banks_count": 1, "caches_count": 0,
        "io_links_count": len(others) + len(gpus), "p2p_links_count": 0, "cpu_core_id_base": min(cpus),
        "simd_id_base": 0, "max_waves_per_simd": 0, "lds_size_in_kb": 0, "gds_size_in_kb": 0, "num_gws": 0,
        "wave_front_size": 0, "array_count": 0, "simd_arrays_per_engine": 0, "cu_per_simd_array": 0,
        "simd_per_cu": 0, "max_slots_scratch_cu": 0, "gfx_target_version": 0, "vendor_id": 0, "device_id": 0,
        "location_id": 0, "domain": 0, "drm_render_minor": 0, "hive_id": 0, "num_sdma_engines": 0,
        "num_sdma_xgmi_engines": 0, "num_sdma_queues_per_engine": 0, "num_cp_queues": 0,
        "max_engine_clk_ccompute": 2400}))
    write(f"{path}/mem_banks/0/properties", _properties({
        "heap_type": 0, "size_in_bytes": 1024 * 2**30, "flags": 0, "width": 64, "mem_clk_max": 4800}))
    links = [_link(CPU_LINK, number, peer, distances[node][other]) for other, peer in others]
    # The kernel adds each GPU's PCIe link in reverse on its CPU node.
    links += [_link(PCIE_LINK, number, gpu_node, PCIE_WEIGHT) for _gpu, gpu_node in gpus]
    for index, text in enumerate(links):
        write(f"{path}/io_links/{index}/properties", text)


def _write_gpu_node(write: Write, path: str, number: int, gpu: Function, index: int, part: int, host: str,
                    cpu_node: int, peers: list[int], hive: int, bank_bytes: int, xcc: int) -> None:
    target, cus, _product = PARTS.get(gpu.device, (90402, 304, ""))
    domain = int(gpu.address.split(":")[0], 16)
    write(f"{path}/gpu_id", f"{(unique_id(host, index) + part) % 65521 + 1}\n")
    write(f"{path}/name", "ip discovery\n")  # what KFD calls every IP-discovery ASIC
    write(f"{path}/properties", _properties({
        "cpu_cores_count": 0, "simd_count": cus * 4, "mem_banks_count": 1, "caches_count": 0,
        "io_links_count": 1 + len(peers), "p2p_links_count": len(peers), "cpu_core_id_base": 0,
        "simd_id_base": 2147487744 + number * 4096, "max_waves_per_simd": 8, "lds_size_in_kb": 64,
        "gds_size_in_kb": 0, "num_gws": 64, "wave_front_size": 64, "array_count": 32,
        "simd_arrays_per_engine": 1, "cu_per_simd_array": 10, "simd_per_cu": 4, "max_slots_scratch_cu": 32,
        "gfx_target_version": target, "vendor_id": gpu.vendor, "device_id": gpu.device,
        "location_id": location_id(gpu.address), "domain": domain,
        "drm_render_minor": 128 + MINORS_PER_GPU * index + part, "hive_id": hive, "num_sdma_engines": 2,
        "num_sdma_xgmi_engines": 14, "num_sdma_queues_per_engine": 8, "num_cp_queues": 24,
        "max_engine_clk_fcompute": 2100, "local_mem_size": 0, "fw_version": 177, "capability": 746727296,
        "unique_id": unique_id(host, index), "num_xcc": xcc, "max_engine_clk_ccompute": 3250}))
    write(f"{path}/mem_banks/0/properties", _properties({
        "heap_type": 1, "size_in_bytes": bank_bytes, "flags": 0, "width": 8192, "mem_clk_max": 1300}))
    write(f"{path}/io_links/0/properties", _link(PCIE_LINK, number, cpu_node, PCIE_WEIGHT))
    for offset, peer in enumerate(peers, start=1):
        write(f"{path}/io_links/{offset}/properties", _link(XGMI_LINK, number, peer, XGMI_WEIGHT,
                                                              XGMI_MAX_BANDWIDTH_MBS))
        write(f"{path}/p2p_links/{offset - 1}/properties", _link(XGMI_LINK, number, peer, XGMI_WEIGHT,
                                                                 XGMI_MAX_BANDWIDTH_MBS))


def _write_pci_attributes(write: Write, link: Callable[[str, str], None], gpu: Function, index: int, host: str,
                          compute: str, memory: str, vram: int, kfd: dict) -> None:
    """amdgpu's files on the PCI function, its render node, and the /dev/dri nodes of the
    GPU's DRM minors (its own first, then its amdgpu_xcp partitions')."""
    _target, _cus, product = PARTS.get(gpu.device, (0, 0, "AMD Instinct"))
    base = gpu.path
    write(f"{base}/unique_id", f"{unique_id(host, index):016x}\n")
    write(f"{base}/product_name", f"{kfd.get('product_name', product)}\n")
    write(f"{base}/mem_info_vram_total", f"{vram}\n")
    write(f"{base}/current_compute_partition", f"{compute}\n")
    write(f"{base}/available_compute_partition", "SPX, DPX, QPX, CPX\n")
    write(f"{base}/current_memory_partition", f"{memory}\n")
    write(f"{base}/available_memory_partition", "NPS1, NPS4\n")
    render = 128 + MINORS_PER_GPU * index
    write(f"{base}/drm/renderD{render}/uevent", f"MAJOR=226\nMINOR={render}\nDEVNAME=dri/renderD{render}\n")
    link(f"sys/class/drm/renderD{render}", os.path.relpath(f"{base}/drm/renderD{render}", "sys/class/drm"))
    card = 1 + MINORS_PER_GPU * index
    for extra in range(MINORS_PER_GPU):
        write(f"dev/dri/renderD{render + extra}", "")
        write(f"dev/dri/card{card + extra}", "")
        if extra:
            xcp = f"sys/devices/platform/amdgpu_xcp_{index * (MINORS_PER_GPU - 1) + extra - 1}/drm"
            write(f"{xcp}/renderD{render + extra}/uevent", f"MAJOR=226\nMINOR={render + extra}\n")
            write(f"{xcp}/card{card + extra}/uevent", f"MAJOR=226\nMINOR={card + extra}\n")
