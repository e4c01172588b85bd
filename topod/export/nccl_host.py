"""The NCCL topology file of a real host: topod.export.nccl's XML with what only the host
tree knows (the CPU's identity from /proc/cpuinfo, NIC names, subsystem ids, GDR
support), written atomically, and what would keep NCCL from building its topology from it.

The CPU's identity (arch, and for x86 vendor, familyid, modelid) is the one attribute NCCL
does not fill everywhere: it reads it from the machine only for the <cpu> above a rank's
own GPU (ncclTopoGetXmlFromSys), so any other <cpu> without it (one holding only NICs, or
another rank's GPUs: ncclTopoFuseXml merges two <cpu> elements only when every attribute
agrees) makes ncclTopoGetSystemFromXml fail with "Attribute arch of node cpu not found"
(NCCL 2.30.7's own parser and system builder, run on these files). Where /proc/cpuinfo
says nothing, the file is still written, with a `nccl_cpu_identity_unknown` warning.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from topod.export.nccl import NIC_KINDS, CpuIdentity, Element, build_nccl_xml, render_nccl_xml
from topod.host import HostRoot
from topod.model import HostWarning, Topology

DEFAULT_PATH = "/var/run/nvidia-topologyd/virtualTopology.xml"  # NCCL's default location


def parse_cpuinfo(text: str | None) -> CpuIdentity:
    """/proc/cpuinfo -> CpuIdentity from its first processor block (fields absent stay None)."""
    fields: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    vendor = fields.get("vendor_id")
    arch = None
    if vendor:
        arch = "x86_64"
    elif "cpu implementer" in fields:
        arch = "arm64"
    elif fields.get("cpu", "").upper().startswith("POWER"):
        arch = "ppc64"
    return CpuIdentity(arch=arch, vendor=vendor, familyid=_int(fields.get("cpu family")),
                       modelid=_int(fields.get("model")))


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def write_nccl_topology(text: str, path: str | os.PathLike[str] = DEFAULT_PATH) -> Path:
    """Write the XML atomically: a temp file in the same directory, fsync, rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="ascii") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)  # NCCL runs as the job's user
        os.replace(temp, target)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    return target


@dataclass(frozen=True, slots=True)
class NcclHostFacts:
    """What the XML needs from the host tree beyond the Topology (read by the shell)."""

    cpu_identity: CpuIdentity
    net_names: dict[str, str]
    subsystem_ids: dict[str, tuple[int, int]]
    gdr: bool | None


# Modules whose presence means GPUDirect RDMA works (what NCCL's ncclGpuGdrSupport checks).
_GDR_MARKERS = ("sys/kernel/mm/memory_peers/nv_mem/version", "sys/module/nvidia_peermem/version",
                "sys/module/nv_peer_mem/version")


def read_nccl_host_facts(host: HostRoot, topology: Topology) -> NcclHostFacts:
    """CPU identity, NIC names, subsystem ids and GDR support from the host tree."""
    net_names: dict[str, str] = {}
    subsystem_ids: dict[str, tuple[int, int]] = {}
    for device in topology.pci_devices:
        base = f"sys/bus/pci/devices/{device.address}"
        if device.kind in NIC_KINDS:
            # NCCL's IB transport names a NIC by its RDMA device, the socket transport by netdev.
            names = host.listdir(f"{base}/infiniband") or host.listdir(f"{base}/net")
            if names:
                net_names[device.address] = names[0]
        vendor, product = _int(host.read_line(f"{base}/subsystem_vendor")), _int(host.read_line(f"{base}/subsystem_device"))
        if vendor is not None and product is not None:
            subsystem_ids[device.address] = (vendor, product)
    # Absent markers mean "unknown" (dma-buf may still give GDR), so NCCL decides, not us.
    gdr = True if any(host.exists(marker) for marker in _GDR_MARKERS) else None
    return NcclHostFacts(parse_cpuinfo(host.read("proc/cpuinfo")), net_names, subsystem_ids, gdr)


@dataclass(frozen=True, slots=True)
class NcclFile:
    text: str
    warnings: tuple[HostWarning, ...]


def host_nccl_xml(host: HostRoot, topology: Topology, *, gpus: Iterable[int] | None = None,
                  cpus: Iterable[int] | None = None, nics: Iterable[str] | None = None) -> NcclFile:
    """The NCCL topology XML of a host (or of a subset of its GPUs and CPUs), with the
    facts only the host tree knows: what `topoctl export nccl` and the daemon write."""
    facts = read_nccl_host_facts(host, topology)
    system = build_nccl_xml(topology, gpus=gpus, cpus=cpus, cpu_identity=facts.cpu_identity,
                            net_names=facts.net_names, subsystem_ids=facts.subsystem_ids, gdr=facts.gdr,
                            nics=nics)
    return NcclFile(render_nccl_xml(system), tuple(identity_warnings(system)))


def identity_warnings(system: Element) -> list[HostWarning]:
    """The file's <cpu> elements NCCL cannot build its topology from (see the module's
    note): any without `arch`, unless it is the only one and holds a GPU, which each rank
    fills alike from the machine."""
    cpus = [child for child in system.children if child.name == "cpu"]
    unknown = [cpu for cpu in cpus if all(key != "arch" for key, _ in cpu.attrs)]
    if not unknown or (len(cpus) == 1 and _holds(cpus[0], "gpu")):
        return []
    nodes = ", ".join(value for cpu in unknown for key, value in cpu.attrs if key == "numaid")
    return [HostWarning("nccl_cpu_identity_unknown", "proc/cpuinfo",
                        f"no CPU identity (vendor_id, CPU implementer or cpu line), so the <cpu> elements of NUMA "
                        f"node(s) {nodes} have no arch: NCCL fills it only on the CPU above a rank's own GPU and "
                        f"fails to build its topology from this file (\"Attribute arch of node cpu not found\")")]


def _holds(element: Element, name: str) -> bool:
    return any(child.name == name or _holds(child, name) for child in element.children)
