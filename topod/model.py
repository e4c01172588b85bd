"""The host model: frozen values that every planner reads and no planner changes.

Discovery builds a Topology once per scan; the allocation engine, the IRQ planner and
the exporters take it as input. Nothing here does I/O.
"""

from __future__ import annotations

from topod.record import field, record

# Where a PCI function's NUMA node came from, best first.
NUMA_SOURCES = ("firmware", "local_cpus", "ancestor", "measured", "single_node", "unknown")

DEVICE_KINDS = ("gpu", "nvswitch", "rdma", "nic", "nvme", "storage", "bridge", "other")
# Where a NUMA node's initiators (the CPUs it is local to) came from.
INITIATOR_SOURCES = ("cpus", "hmat-access1", "hmat-access0", "slit", "none")


@record
class HostWarning:
    """A guess or a skip, with the file it concerns and the reason."""

    code: str
    path: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "path": self.path, "reason": self.reason}


@record
class HugePages:
    """One node's pool of one huge page size: nr_hugepages and free_hugepages (pages)."""

    total: int
    free: int

    def to_json(self) -> dict[str, int]:
        return {"total": self.total, "free": self.free}


@record
class NumaNode:
    id: int
    cpus: tuple[int, ...]  # online CPUs only
    distances: dict[int, int]  # SLIT row: node id -> distance (10 = local)
    memory_bytes: int | None
    listed_cpus: tuple[int, ...] = ()  # the node's cpulist as sysfs gives it, offline included
    local_cpus: tuple[int, ...] = ()  # its own CPUs, or for a CPU-less node the nearest ones
    initiators: tuple[int, ...] = ()  # CPU nodes local_cpus came from (HMAT, else SLIT)
    initiator_source: str = "cpus"  # one of INITIATOR_SOURCES
    access: MemoryAccess | None = None  # HMAT performance from the initiators
    memory_tier: int | None = None  # memory_tiering/memory_tierN holding the node
    gpu: int | None = None  # index of the GPU whose memory this node is
    hugepages: dict[int, HugePages] = field(default_factory=dict)  # page size in KiB -> pool

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "cpus": list(self.cpus),
            "local_cpus": list(self.local_cpus),
            "distances": {str(k): v for k, v in sorted(self.distances.items())},
            "memory_bytes": self.memory_bytes,
            "memory_only": not self.has_cpus,
            "initiators": list(self.initiators),
            "initiator_source": self.initiator_source,
            "access": self.access.to_json() if self.access else None,
            "memory_tier": self.memory_tier,
            "gpu": self.gpu,
            "hugepages": {str(size): pool.to_json() for size, pool in sorted(self.hugepages.items())},
        }


@record
class MemoryAccess:
    """HMAT figures of a node from its best initiators: MB/s and nanoseconds."""

    read_bandwidth: int | None = None
    write_bandwidth: int | None = None
    read_latency: int | None = None
    write_latency: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {"read_bandwidth_mb_s": self.read_bandwidth, "write_bandwidth_mb_s": self.write_bandwidth,
                "read_latency_ns": self.read_latency, "write_latency_ns": self.write_latency}


@record
class Cpu:
    id: int
    online: bool
    core: int | None  # the kernel's core_id (unique within a package only)
    package: int | None  # None where the kernel does not know it (physical_package_id -1)
    numa_node: int | None
    siblings: tuple[int, ...]  # hyper-thread siblings, itself included
    llc: int | None  # id of the last-level cache domain: lowest CPU sharing it
    isolated: bool = False
    nohz_full: bool = False

    @property
    def physical_core(self) -> tuple[int, ...]:
        """The CPUs of this CPU's physical core (a stable key across packages)."""
        return self.siblings or (self.id,)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "online": self.online,
            "core": self.core,
            "package": self.package,
            "numa_node": self.numa_node,
            "siblings": list(self.siblings),
            "llc": self.llc,
            "isolated": self.isolated,
            "nohz_full": self.nohz_full,
        }


@record
class PciLink:
    current_speed: str | None
    current_width: int | None
    max_speed: str | None
    max_width: int | None

    @property
    def degraded(self) -> bool:
        """Trained below what the device and slot support (a common, silent fault)."""
        if self.current_width and self.max_width and self.current_width < self.max_width:
            return True
        current, maximum = gts(self.current_speed), gts(self.max_speed)
        return current is not None and maximum is not None and current < maximum

    def to_json(self) -> dict[str, object]:
        return {
            "current_speed": self.current_speed,
            "current_width": self.current_width,
            "max_speed": self.max_speed,
            "max_width": self.max_width,
            "degraded": self.degraded,
        }


def gts(speed: str | None) -> float | None:
    """'16.0 GT/s PCIe' -> 16.0; None for 'Unknown' or garbage."""
    if not speed:
        return None
    head = speed.split()[0]
    try:
        return float(head)
    except ValueError:
        return None


# An RDMA port's logical state as the kernel's infiniband/<dev>/ports/<n>/state names it.
RDMA_PORT_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")


@record
class RdmaPort:
    """One port of an RDMA device (infiniband/<device>/ports/<port>), as sysfs gave it."""

    device: str  # the RDMA device name, e.g. mlx5_0 (what NCCL_IB_HCA and UCX name)
    port: int  # 1-based port number
    state: str  # one of RDMA_PORT_STATES, or "unknown" when unreadable
    link_layer: str | None = None  # InfiniBand | Ethernet (RoCE); None when unreadable
    phys_state: str | None = None  # e.g. LinkUp, Disabled, Polling

    @property
    def active(self) -> bool:
        """Whether traffic can flow: only an ACTIVE port is offered to jobs."""
        return self.state == "ACTIVE"

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "port": self.port, "state": self.state, "link_layer": self.link_layer,
                "phys_state": self.phys_state, "active": self.active}


@record
class PciDevice:
    address: str  # domain:bus:slot.function, e.g. 0000:18:00.0
    vendor: int | None
    device: int | None
    class_code: int | None  # 24-bit class, e.g. 0x030200
    kind: str
    driver: str | None
    parent: str | None  # address of the upstream bridge, None on a root bus
    root_complex: str  # host bridge directory, e.g. pci0000:17; "" outside any (JSON null)
    root_port: str | None  # topmost bridge above (or self, for a root port)
    switch: str | None  # upstream port of the nearest PCIe switch above, if any
    numa_node_raw: int | None
    numa_node: int | None
    numa_node_source: str
    local_cpus: tuple[int, ...]
    link: PciLink | None
    msi_irqs: tuple[int, ...]
    names: tuple[str, ...] = ()  # net/infiniband/nvme/drm names of its children
    bridge_chain: tuple[str, ...] = ()  # bridges from the root port down to parent
    rdma_ports: tuple[RdmaPort, ...] = ()  # ports of its infiniband/ children (kind rdma)

    def to_json(self) -> dict[str, object]:
        return {
            "address": self.address,
            "vendor": _hex(self.vendor, 4),
            "device": _hex(self.device, 4),
            "class": _hex(self.class_code, 6),
            "kind": self.kind,
            "driver": self.driver,
            "parent": self.parent,
            "root_complex": self.root_complex or None,
            "root_port": self.root_port,
            "switch": self.switch,
            "numa_node_raw": self.numa_node_raw,
            "numa_node": self.numa_node,
            "numa_node_source": self.numa_node_source,
            "local_cpus": list(self.local_cpus),
            "link": self.link.to_json() if self.link else None,
            "msi_irqs": list(self.msi_irqs),
            "names": list(self.names),
            "rdma_ports": [port.to_json() for port in self.rdma_ports],
        }


def _hex(value: int | None, width: int) -> str | None:
    return None if value is None else f"0x{value:0{width}x}"


@record
class NvLink:
    link: int
    active: bool
    remote_pci_bus_id: str
    remote_device_type: str  # gpu | switch | cpu


@record
class Gpu:
    index: int
    address: str
    uuid: str | None
    name: str | None
    memory_total_mib: int | None
    compute_capability: tuple[int, int] | None
    numa_node: int | None
    nvlinks: tuple[NvLink, ...] = ()
    source: str = "sysfs"  # nvml-live | nvml-file | sysfs
    memory_numa_node: int | None = None  # the NUMA node holding its memory (Grace, POWER9)
    memory_numa_source: str | None = None  # nvml-live | nvml-file | sysfs-heuristic
    c2c: C2cLink | None = None  # NVLink-C2C to its CPU node
    fabric: GpuFabric | None = None  # multi-node NVLink (NVL72-class) membership
    minor: int | None = None  # device minor (N of /dev/nvidiaN): the driver's, else NVML's; None unknown
    vendor: str | None = None  # nvidia | amd | intel | the PCI vendor id in hex
    model: str | None = None  # marketing name: NVML's, AMD's device id table, else the PCI id
    amd: AmdGpu | None = None  # what amdgpu's KFD topology and sysfs say (AMD GPUs only)

    @property
    def device_files(self) -> tuple[str, ...]:
        """The device nodes a job opens to use this GPU (the shared control nodes aside:
        /dev/nvidiactl and friends, /dev/kfd): /dev/nvidiaN, or an AMD GPU's render node."""
        if self.amd is not None and self.amd.render_minor is not None:
            return (self.amd.render_node,)
        return (self.device_file,)

    @property
    def device_number(self) -> int:
        """N of /dev/nvidiaN: the device minor, else (unknown, warned at discovery) the index."""
        return self.minor if self.minor is not None else self.index

    @property
    def device_file(self) -> str:
        return f"/dev/nvidia{self.device_number}"

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "minor": self.minor,
            "address": self.address,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "compute_capability": list(self.compute_capability) if self.compute_capability else None,
            "vendor": self.vendor,
            "model": self.model,
            "numa_node": self.numa_node,
            "source": self.source,
            "memory_numa_node": self.memory_numa_node,
            "memory_numa_source": self.memory_numa_source,
            "c2c": self.c2c.to_json() if self.c2c else None,
            "fabric": self.fabric.to_json() if self.fabric else None,
            "nvlinks": [
                {
                    "link": link.link,
                    "active": link.active,
                    "remote_pci_bus_id": link.remote_pci_bus_id,
                    "remote_device_type": link.remote_device_type,
                }
                for link in self.nvlinks
            ],
            **({"amd": self.amd.to_json()} if self.amd is not None else {}),
        }


@record
class AmdGpu:
    """An AMD GPU as amdgpu's KFD topology and PCI attributes give it."""

    kfd_nodes: tuple[int, ...]  # its KFD node numbers: one per compute partition
    gpu_id: int | None  # KFD's gpu_id of its first node
    unique_id: int | None  # 64-bit, what ROCr's GPU-<hex> names
    hive_id: int | None  # xGMI hive (0 or None: in no hive)
    render_minor: int | None  # N of /dev/dri/renderDN (its first partition's)
    card: int | None  # N of /dev/dri/cardN, from its PCI function's drm/ children
    gfx_target_version: int | None = None  # e.g. 90402 = gfx942
    compute_partition: str | None = None  # SPX | DPX | QPX | CPX
    memory_partition: str | None = None  # NPS1 | NPS2 | NPS4
    render_minors: tuple[int, ...] = ()  # every partition's render minor, first partition first

    @property
    def rocr_uuid(self) -> str | None:
        """What ROCR_VISIBLE_DEVICES and rocminfo call it: GPU-<unique_id as 16 hex digits>."""
        return None if not self.unique_id else f"GPU-{self.unique_id:016x}"

    @property
    def render_node(self) -> str:
        return f"/dev/dri/renderD{self.render_minor}"

    @property
    def gfx_target(self) -> str | None:
        """90402 -> 'gfx942' (major, minor, stepping: stepping in hex, as LLVM spells it)."""
        version = self.gfx_target_version
        if not version:
            return None
        return f"gfx{version // 10000}{(version // 100) % 100}{version % 100:x}"

    def to_json(self) -> dict[str, object]:
        return {"kfd_nodes": list(self.kfd_nodes), "gpu_id": self.gpu_id,
                "unique_id": None if self.unique_id is None else f"0x{self.unique_id:016x}",
                "rocr_uuid": self.rocr_uuid,
                "hive_id": None if not self.hive_id else f"0x{self.hive_id:016x}",
                "render_minor": self.render_minor, "render_minors": list(self.render_minors), "card": self.card,
                "gfx_target": self.gfx_target, "compute_partition": self.compute_partition,
                "memory_partition": self.memory_partition}


@record
class C2cLink:
    """NVLink-C2C between a GPU and its CPU: one-direction GB/s and where that came from."""

    bandwidth_gbps: float | None
    source: str  # nvml-live | nvml-file | table

    def to_json(self) -> dict[str, object]:
        return {"bandwidth_gbps": self.bandwidth_gbps, "source": self.source}


@record
class GpuFabric:
    """A GPU's place in a multi-node NVLink domain (NVML GPU fabric info)."""

    cluster_uuid: str | None
    clique_id: int | None
    state: str  # not-supported | not-started | in-progress | completed | unknown
    health: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"cluster_uuid": self.cluster_uuid, "clique_id": self.clique_id, "state": self.state,
                "health": self.health}


@record
class NvlinkFabric:
    """NVLink as topod sees it: direct links per GPU pair, and NVSwitch islands."""

    pairs: dict[tuple[int, int], int] = field(default_factory=dict)  # (i<j) -> links
    islands: tuple[tuple[int, ...], ...] = ()  # GPU indices all-to-all through NVSwitch
    island_links: dict[int, int] = field(default_factory=dict)  # GPU index -> links to switches
    source: str = "none"  # nvml-live | nvml-file | none
    xgmi: dict[tuple[int, int], int] = field(default_factory=dict)  # (i<j) -> AMD xGMI links (KFD io_links)
    hives: tuple[tuple[int, ...], ...] = ()  # GPU indices of each xGMI hive

    def links_between(self, a: int, b: int) -> int:
        return self.pairs.get((min(a, b), max(a, b)), 0)

    def xgmi_between(self, a: int, b: int) -> int:
        return self.xgmi.get((min(a, b), max(a, b)), 0)

    def hive_of(self, gpu: int) -> tuple[int, ...] | None:
        for hive in self.hives:
            if gpu in hive:
                return hive
        return None

    def island_of(self, gpu: int) -> tuple[int, ...] | None:
        for island in self.islands:
            if gpu in island:
                return island
        return None

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "pairs": [{"gpus": [a, b], "links": n} for (a, b), n in sorted(self.pairs.items())],
            "nvswitch_islands": [
                {"gpus": list(island), "links_per_gpu": {str(g): self.island_links.get(g, 0) for g in island}}
                for island in self.islands
            ],
            **({"xgmi": [{"gpus": [a, b], "links": n} for (a, b), n in sorted(self.xgmi.items())],
                "xgmi_hives": [list(hive) for hive in self.hives]} if self.xgmi or self.hives else {}),
        }


@record
class Topology:
    root: str
    numa_nodes: tuple[NumaNode, ...]
    cpus: tuple[Cpu, ...]
    pci_devices: tuple[PciDevice, ...]
    gpus: tuple[Gpu, ...]
    nvlink: NvlinkFabric
    warnings: tuple[HostWarning, ...]
    driver_version: str | None = None
    hostname: str | None = None  # proc/sys/kernel/hostname of the tree

    def node(self, node_id: int) -> NumaNode | None:
        for node in self.numa_nodes:
            if node.id == node_id:
                return node
        return None

    def cpu(self, cpu_id: int) -> Cpu | None:
        for cpu in self.cpus:
            if cpu.id == cpu_id:
                return cpu
        return None

    def device(self, address: str) -> PciDevice | None:
        for device in self.pci_devices:
            if device.address == address:
                return device
        return None

    def devices_of_kind(self, *kinds: str) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.pci_devices if d.kind in kinds)

    def gpu(self, index: int) -> Gpu | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    @property
    def online_cpus(self) -> tuple[int, ...]:
        return tuple(cpu.id for cpu in self.cpus if cpu.online)

    @property
    def isolated_cpus(self) -> tuple[int, ...]:
        return tuple(cpu.id for cpu in self.cpus if cpu.isolated)

    @property
    def nohz_full_cpus(self) -> tuple[int, ...]:
        return tuple(cpu.id for cpu in self.cpus if cpu.nohz_full)

    def slit(self, a: int | None, b: int | None) -> int | None:
        """SLIT distance between two nodes, None when either is unknown."""
        if a is None or b is None:
            return None
        node = self.node(a)
        if node is None:
            return None
        return node.distances.get(b)
