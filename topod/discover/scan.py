"""One discovery pass: host tree in, Topology out."""

from __future__ import annotations

from topod.discover.cpus import read_cpu_facts, read_cpus
from topod.discover.gpumemory import link_gpu_memory
from topod.discover.gpuminor import with_minors
from topod.discover.gpunames import gpu_vendor, pci_model
from topod.discover.identity import read_hostname
from topod.discover.kfd import AmdFacts, amd_gpus, group_gpu_nodes, read_amdsmi, read_kfd_nodes, read_pci_attributes
from topod.discover.memo import DiscoveryMemo
from topod.discover.memory import apply_memory_facts
from topod.discover.notes import Notes
from topod.discover.numa import nodes_from_cpus_without_sysfs, read_numa_nodes
from topod.discover.nvml import NvmlReport, build_fabric, nvml_minors, read_nvml
from topod.discover.pci import read_functions
from topod.discover.pcitree import build_pci_devices
from topod.errors import NotAHostTreeError
from topod.host import HostRoot, ReadProblem
from topod.model import Gpu, NumaNode, PciDevice, Topology
from topod.record import replace


def discover(host: HostRoot, *, live_nvml: bool = True, memo: DiscoveryMemo | None = None) -> Topology:
    """Read the whole host. Never raises for odd content: guesses and skips go to
    Topology.warnings, and so does every file that is there but could not be read
    (permission_denied, not_a_regular_file, file_too_large, read_error). Raises
    NotAHostTreeError when the root has no CPUs at all. A memo (kept by a caller that
    rescans the same host) skips what cannot have changed since the last pass."""
    if memo is not None:
        memo.begin_pass(host.root_text)
    with host.collecting_problems() as problems:
        topology = _discover(host, Notes(), problems, live_nvml, memo)
    if memo is not None:
        memo.end_pass()
    return topology


def _discover(host: HostRoot, notes: Notes, problems: list[ReadProblem], live_nvml: bool,
              memo: DiscoveryMemo | None) -> Topology:
    facts = read_cpu_facts(host, notes)
    if not facts.present and not facts.online:
        why = f" ({problems[0].path}: {problems[0].reason})" if problems else ""
        raise NotAHostTreeError(f"--root {host.root_text}: no CPUs under sys/devices/system/cpu{why}; not a host tree")
    nodes = apply_memory_facts(host, read_numa_nodes(host, facts.online, notes), notes)
    if not nodes:
        nodes = nodes_from_cpus_without_sysfs(facts.online, notes)
    node_of_cpu = _node_of_cpu(nodes)
    for cpu in sorted(facts.online - set(node_of_cpu)):
        notes.add("cpu_without_node", f"sys/devices/system/cpu/cpu{cpu}", "online CPU listed by no NUMA node")
    if memo is None:
        cpus = read_cpus(host, facts, node_of_cpu, notes)
    else:
        key = (tuple(facts.present), frozenset(facts.online), frozenset(facts.isolated),
               frozenset(facts.nohz_full), tuple(sorted(node_of_cpu.items())))
        cpus = memo.cpus_for(key, host, notes, lambda: read_cpus(host, facts, node_of_cpu, notes))
    devices = build_pci_devices(read_functions(host, notes, memo), nodes, facts.online, notes)
    has_nvidia = any(d.vendor == 0x10DE for d in devices)
    report = read_nvml(host, notes, allow_live=live_nvml, expect_gpus=has_nvidia)
    kfd_nodes = read_kfd_nodes(host, notes)
    kfd_addresses = set(group_gpu_nodes(kfd_nodes, Notes())) if kfd_nodes else set()
    others = [d for d in devices if d.address not in kfd_addresses]  # NVML's, or PCI order
    gpus, nodes = link_gpu_memory(build_gpus(others, report, notes), report, nodes, notes)
    gpus = with_minors(host, gpus, nvml_minors(report), notes)
    fabric = build_fabric(report, {gpu.address: gpu.index for gpu in gpus})
    if kfd_nodes:
        amd = _amd_gpus(host, kfd_nodes, devices, nodes, len(gpus), live_nvml, notes)
        gpus = gpus + amd.gpus
        fabric = replace(fabric, xgmi=amd.xgmi, hives=amd.hives)
    notes.add_read_problems(problems)
    return Topology(
        root=host.root_text,
        numa_nodes=tuple(nodes),
        cpus=tuple(cpus),
        pci_devices=tuple(devices),
        gpus=tuple(gpus),
        nvlink=fabric,
        warnings=tuple(notes.items),
        driver_version=report.driver_version if report else None,
        hostname=read_hostname(host),
    )


def _amd_gpus(host: HostRoot, kfd_nodes: list, devices: list[PciDevice], nodes: list[NumaNode],
              first_index: int, live: bool, notes: Notes) -> AmdFacts:
    """The KFD GPUs after NVML's (or the PCI-order ones), with amdgpu's PCI attributes."""
    by_address = {device.address: device for device in devices}
    addresses = group_gpu_nodes(kfd_nodes, notes)
    attributes = {address: read_pci_attributes(host, address, by_address[address].names)
                  for address in addresses if address in by_address}
    extras = read_amdsmi(host, notes) if live else {}
    return amd_gpus(kfd_nodes, devices, nodes, attributes, extras, first_index, notes)


def _node_of_cpu(nodes: list[NumaNode]) -> dict[int, int]:
    owner: dict[int, int] = {}
    for node in nodes:
        for cpu in node.cpus:
            owner.setdefault(cpu, node.id)
    return owner


def build_gpus(devices: list[PciDevice], report: NvmlReport | None, notes: Notes) -> list[Gpu]:
    """GPUs as NVML numbers them when NVML speaks; otherwise the PCI functions of kind
    'gpu' in bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID), said so in warnings."""
    by_address = {device.address: device for device in devices}
    if report is not None:
        gpus = []
        for entry in sorted(report.gpus, key=lambda g: g.index):
            device = by_address.get(entry.pci_bus_id)
            if device is None:
                notes.add(
                    "nvml_gpu_not_in_sysfs",
                    f"sys/bus/pci/devices/{entry.pci_bus_id}",
                    f"NVML GPU {entry.index} has no PCI function in sysfs; its locality is unknown",
                )
            gpus.append(
                Gpu(
                    index=entry.index,
                    address=entry.pci_bus_id,
                    uuid=entry.uuid,
                    name=entry.name,
                    memory_total_mib=entry.memory_total_mib,
                    compute_capability=entry.compute_capability,
                    numa_node=device.numa_node if device else None,
                    nvlinks=entry.nvlinks,
                    source=report.source,
                    vendor="nvidia",
                    model=entry.name or (pci_model(device.vendor, device.device) if device else None),
                )
            )
        return gpus
    pci_gpus = [device for device in devices if device.kind == "gpu"]
    if pci_gpus:
        notes.add(
            "gpu_index_from_pci_order",
            "sys/bus/pci/devices",
            f"{len(pci_gpus)} GPU(s) found in sysfs without NVML: indices follow PCI bus order",
        )
    return [
        Gpu(index=i, address=d.address, uuid=None, name=None, memory_total_mib=None,
            compute_capability=None, numa_node=d.numa_node, source="sysfs",
            vendor=gpu_vendor(d.vendor), model=pci_model(d.vendor, d.device))
        for i, d in enumerate(pci_gpus)
    ]
