"""`topoctl snapshot`: capture what discovery reads into a tar.gz host tree.

In the spirit of hwloc-gather-topology, but an allowlist: only the files topod reads,
each copied by reading it (sysfs reports 4096 bytes for every file), links kept as links.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from topod.discover.devnames import VIRTIO_CHILD_DIRS, is_virtio_dir
from topod.discover.fabric import extras_to_json
from topod.discover.notes import Notes
from topod.discover.nvml import NVML_FILE, NvmlReport, read_live_nvml
from topod.host import HostRoot
from topod.outfile import replaced_whole
from topod.sysnames import is_pci_address

CPU_FILES = ("online", "possible", "present", "offline", "isolated", "nohz_full", "kernel_max")
# The masks beside the lists: discovery reads them where a kernel has no list (read_cpu_set).
CPU_TOPOLOGY = ("core_id", "physical_package_id", "die_id", "thread_siblings_list", "core_cpus_list",
                "package_cpus_list", "core_siblings_list", "thread_siblings", "core_cpus")
CACHE_FILES = ("level", "type", "shared_cpu_list", "shared_cpu_map", "size", "id")
NODE_FILES = ("cpulist", "cpumap", "distance", "meminfo")
HUGEPAGE_FILES = ("nr_hugepages", "free_hugepages", "surplus_hugepages")
PCI_FILES = ("vendor", "device", "class", "numa_node", "local_cpus", "local_cpulist", "current_link_speed",
             "current_link_width", "max_link_speed", "max_link_width", "subsystem_vendor", "subsystem_device",
             "revision", "irq", "uevent")
PCI_CHILD_CLASSES = ("net", "infiniband", "nvme", "drm")
AMD_VENDOR = "0x1002"
# amdgpu's attributes on an AMD GPU's function (topod.discover.kfd reads them)
AMD_GPU_FILES = ("unique_id", "product_name", "mem_info_vram_total", "current_compute_partition",
                 "available_compute_partition", "current_memory_partition", "available_memory_partition")
KFD_CLASS = "sys/class/kfd/kfd"
KFD_NODE_DIRS = ("mem_banks", "io_links", "p2p_links", "caches")
PROC_FILES = ("cpuinfo", "meminfo", "stat", "interrupts", "softirqs", "cmdline", "sys/kernel/hostname")
ACCESS_FILES = ("read_bandwidth", "write_bandwidth", "read_latency", "write_latency")
TIER_DIR = "sys/devices/virtual/memory_tiering"
IRQ_FILES = ("smp_affinity_list", "effective_affinity_list", "node", "smp_affinity")


@dataclass(frozen=True, slots=True)
class Entry:
    path: str  # relative to the root
    data: bytes | None = None
    link: str | None = None


def collect(host: HostRoot) -> Iterator[Entry]:
    yield from _cpu_entries(host)
    yield from _node_entries(host)
    yield from _pci_entries(host)
    for name in PROC_FILES:
        yield from _file(host, f"proc/{name}")
    yield from _driver_gpu_entries(host)
    yield from _kfd_entries(host)
    for irq in host.listdir("proc/irq"):
        if irq.isdigit():
            for name in IRQ_FILES:
                yield from _file(host, f"proc/irq/{irq}/{name}")
    for name in host.listdir("run/udev/data"):
        if name.startswith(("+pci:", "n", "+infiniband:", "+nvme:", "+net:", "c")):
            yield from _file(host, f"run/udev/data/{name}")


def _file(host: HostRoot, rel: str) -> Iterator[Entry]:
    """A regular file within its read cap (topod.cappedread.read_cap); anything else is left out:
    a missing file silently, the others noted in host.read_problems. A FIFO never
    blocks the snapshot, and a file over its cap is not copied cut short."""
    data = host.read_data(rel)
    if data is not None:
        yield Entry(rel, data=data)


def _link(host: HostRoot, rel: str) -> Iterator[Entry]:
    target = host.readlink(rel)
    if target is not None:
        yield Entry(rel, link=target)


def _cpu_entries(host: HostRoot) -> Iterator[Entry]:
    base = "sys/devices/system/cpu"
    for name in CPU_FILES:
        yield from _file(host, f"{base}/{name}")
    for cpu in host.listdir(base):
        if not (cpu.startswith("cpu") and cpu[3:].isdigit()):
            continue
        yield from _file(host, f"{base}/{cpu}/online")
        for name in CPU_TOPOLOGY:
            yield from _file(host, f"{base}/{cpu}/topology/{name}")
        for index in host.listdir(f"{base}/{cpu}/cache"):
            if index.startswith("index"):
                for name in CACHE_FILES:
                    yield from _file(host, f"{base}/{cpu}/cache/{index}/{name}")


def _node_entries(host: HostRoot) -> Iterator[Entry]:
    base = "sys/devices/system/node"
    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        yield from _file(host, f"{base}/{name}")
    for node in host.listdir(base):
        if node.startswith("node") and node[4:].isdigit():
            for name in NODE_FILES:
                yield from _file(host, f"{base}/{node}/{name}")
            yield from _hugepage_entries(host, f"{base}/{node}/hugepages")
            yield from _access_entries(host, f"{base}/{node}")
    for tier in host.listdir(TIER_DIR):
        if tier.startswith("memory_tier"):
            yield from _file(host, f"{TIER_DIR}/{tier}/nodelist")


def _access_entries(host: HostRoot, node_dir: str) -> Iterator[Entry]:
    """HMAT: accessN/initiators/nodeM (links, kept as links) and the performance files."""
    for access in host.listdir(node_dir):
        if not (access.startswith("access") and access[6:].isdigit()):
            continue
        base = f"{node_dir}/{access}/initiators"
        for name in host.listdir(base):
            if name.startswith("node") and name[4:].isdigit():
                yield from _link(host, f"{base}/{name}")
            elif name in ACCESS_FILES:
                yield from _file(host, f"{base}/{name}")


def _hugepage_entries(host: HostRoot, base: str) -> Iterator[Entry]:
    """nodeN/hugepages/hugepages-<size>kB/{nr,free,surplus}_hugepages."""
    for size in host.listdir(base):
        if size.startswith("hugepages-"):
            for name in HUGEPAGE_FILES:
                yield from _file(host, f"{base}/{size}/{name}")


def _driver_gpu_entries(host: HostRoot) -> Iterator[Entry]:
    """/proc/driver/nvidia/gpus/<bdf>/information: the device minor of each GPU."""
    for address in host.listdir("proc/driver/nvidia/gpus"):
        if is_pci_address(address.lower(), lower=True):
            yield from _file(host, f"proc/driver/nvidia/gpus/{address}/information")


def _kfd_entries(host: HostRoot) -> Iterator[Entry]:
    """amdgpu's KFD topology (sys/class/kfd/kfd -> sys/devices/virtual/kfd/kfd) and the
    names under /dev/dri and /dev/kfd, as empty files (a tree holds no device nodes)."""
    yield from _link(host, KFD_CLASS)
    base = (host.resolve(KFD_CLASS) or "").lstrip("/") if host.readlink(KFD_CLASS) else KFD_CLASS
    top = f"{base}/topology"
    for name in ("generation_id", "system_properties"):
        yield from _file(host, f"{top}/{name}")
    for node in host.listdir(f"{top}/nodes"):
        if not node.isdigit():
            continue
        for name in ("gpu_id", "name", "properties"):
            yield from _file(host, f"{top}/nodes/{node}/{name}")
        for sub in KFD_NODE_DIRS:
            for item in host.listdir(f"{top}/nodes/{node}/{sub}"):
                if item.isdigit():
                    yield from _file(host, f"{top}/nodes/{node}/{sub}/{item}/properties")
    for name in host.listdir("dev/dri"):
        if name.startswith(("card", "renderD")):
            yield Entry(f"dev/dri/{name}", data=b"")
    if host.exists("dev/kfd"):
        yield Entry("dev/kfd", data=b"")


def _pci_entries(host: HostRoot) -> Iterator[Entry]:
    bus = "sys/bus/pci/devices"
    for name in host.listdir(bus):
        if host.readlink(f"{bus}/{name}") is not None:
            yield from _link(host, f"{bus}/{name}")
            real = (host.resolve(f"{bus}/{name}") or "").lstrip("/")
            if real.startswith("sys/devices/") and not real.split("/")[2].startswith("pci"):
                yield from _function_files(host, real)  # outside sys/devices/pci*: not walked below
        elif is_pci_address(name, lower=True):  # a function outside any host bridge: a plain directory
            yield from _function_files(host, f"{bus}/{name}")
    for top in host.listdir("sys/devices"):
        if top.startswith("pci"):
            yield from _pci_tree(host, f"sys/devices/{top}")
    for cls in PCI_CHILD_CLASSES:
        for name in host.listdir(f"sys/class/{cls}"):
            yield from _link(host, f"sys/class/{cls}/{name}")


def _pci_tree(host: HostRoot, path: str) -> Iterator[Entry]:
    for name in host.listdir(path):
        child = f"{path}/{name}"
        if not is_pci_address(name, lower=True) or host.readlink(child) is not None:
            continue
        yield from _function_files(host, child)
        yield from _pci_tree(host, child)


def _function_files(host: HostRoot, child: str) -> Iterator[Entry]:
    """A function's attributes, driver link, MSI vectors and named children."""
    for file_name in PCI_FILES:
        yield from _file(host, f"{child}/{file_name}")
    if (host.read_line(f"{child}/vendor") or "").strip().lower() == AMD_VENDOR:
        for file_name in AMD_GPU_FILES:
            yield from _file(host, f"{child}/{file_name}")
    yield from _link(host, f"{child}/driver")
    for irq in host.listdir(f"{child}/msi_irqs"):
        yield from _file(host, f"{child}/msi_irqs/{irq}")
    for cls in PCI_CHILD_CLASSES:
        for sub in host.listdir(f"{child}/{cls}"):
            yield from _file(host, f"{child}/{cls}/{sub}/uevent")
            if cls == "infiniband":  # the ports the GPU-NIC pairing offers (topod.discover.rdma)
                for port in host.listdir(f"{child}/{cls}/{sub}/ports"):
                    for attr in ("state", "phys_state", "link_layer"):
                        yield from _file(host, f"{child}/{cls}/{sub}/ports/{port}/{attr}")
    for entry in host.listdir(child):  # block/NAME and virtioN/{net,block}/NAME
        if entry == "block":
            for sub in host.listdir(f"{child}/block"):
                yield from _file(host, f"{child}/block/{sub}/uevent")
        elif is_virtio_dir(entry):
            for cls in VIRTIO_CHILD_DIRS:
                for sub in host.listdir(f"{child}/{entry}/{cls}"):
                    yield from _file(host, f"{child}/{entry}/{cls}/{sub}/uevent")


def nvml_report_to_json(report: NvmlReport) -> dict[str, object]:
    return {
        "driver_version": report.driver_version,
        "gpus": [
            {
                "index": gpu.index,
                "pci_bus_id": gpu.pci_bus_id,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_total_mib": gpu.memory_total_mib,
                "compute_capability": list(gpu.compute_capability) if gpu.compute_capability else None,
                "minor_number": gpu.minor_number,
                "nvlinks": [
                    {"link": link.link, "active": link.active, "remote_pci_bus_id": link.remote_pci_bus_id,
                     "remote_device_type": link.remote_device_type}
                    for link in gpu.nvlinks
                ],
                **extras_to_json(gpu.extras),
            }
            for gpu in report.gpus
        ],
    }


def _nvml_entry(host: HostRoot) -> Iterator[Entry]:
    if host.is_live:
        report = read_live_nvml(Notes())
        if report is not None:
            yield Entry(NVML_FILE, data=(json.dumps(nvml_report_to_json(report), indent=2) + "\n").encode())
            return
    yield from _file(host, NVML_FILE)


def write_snapshot(host: HostRoot, output: str, top: str) -> int:
    """Write the snapshot; returns the number of entries."""
    count = 0
    now = time.time()
    with replaced_whole(output) as handle, tarfile.open(fileobj=handle, mode="w:gz") as archive:
        seen_dirs: set[str] = set()
        for entry in [*collect(host), *_nvml_entry(host)]:
            _add_parents(archive, top, entry.path, seen_dirs, now)
            info = tarfile.TarInfo(f"{top}/{entry.path}")
            info.mtime = int(now)
            if entry.link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                archive.addfile(info)
            else:
                data = entry.data or b""
                info.size = len(data)
                info.mode = 0o644
                archive.addfile(info, io.BytesIO(data))
            count += 1
    return count


def _add_parents(archive: tarfile.TarFile, top: str, path: str, seen: set[str], now: float) -> None:
    parts = path.split("/")[:-1]
    for depth in range(len(parts) + 1):
        directory = "/".join([top, *parts[:depth]])
        if directory in seen:
            continue
        seen.add(directory)
        info = tarfile.TarInfo(directory)
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        info.mtime = int(now)
        archive.addfile(info)
