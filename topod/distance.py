"""The multi-level distance between PCI devices, and the weights the planners use.

Levels follow `nvidia-smi topo -m`, best first:

  X     the same device
  C2C   a GPU and its own CPU node over NVLink-C2C (Grace Hopper/Blackwell): GPU <-> node
        only (`gpu_to_node`), never between two PCI devices
  NV#   # direct NVLink links between two GPUs
  NVS   both GPUs in one NVSwitch island (all-to-all; # = the fewer per-GPU links)
  XGMI  AMD GPUs joined by xGMI links (an MI300-class hive is all-to-all, one link a pair,
        as NVSwitch is for NVIDIA); weighed as NVLink of the same bandwidth
  PIX   through at most one PCIe switch
  PXB   through several PCIe switches, without the host bridge
  PHB   through the PCIe host bridge (same root complex)
  NODE  between root complexes of one NUMA node
  SYS   across NUMA nodes (weighted by the SLIT distance)

Weights live here and nowhere else. A measured link table (probe/) may scale a pair's
weight through `corrections`; nothing else changes them.
"""

from __future__ import annotations

from topod.model import PciDevice, Topology
from topod.record import field, record


BASE_WEIGHTS = {"X": 0.0, "PIX": 10.0, "PXB": 20.0, "PHB": 30.0, "NODE": 40.0, "SYS": 50.0}
NVLINK_SCALE = 10.0  # NV# weight = NVLINK_SCALE / (links + 1): NV1 = 5, NV4 = 2, NV18 = 0.53
SLIT_REMOTE = 20  # SLIT distance at which SYS costs exactly BASE_WEIGHTS["SYS"]
NVLINK_GBPS_PER_LINK = 25.0  # the unit C2C bandwidth is counted in (as NVLink links)
C2C_DEFAULT_GBPS = 450.0  # one direction, GH200/GB200 datasheets, when no figure is known
XGMI_GBPS_PER_LINK = 64.0  # one MI300X xGMI link (x16, 32 Gb/s per lane), one direction


def c2c_weight(gbps: float | None) -> float:
    """C2C weighs like NVLink of the same bandwidth: 450 GB/s = 18 links -> 0.53."""
    return nvlink_weight(int((gbps or C2C_DEFAULT_GBPS) / NVLINK_GBPS_PER_LINK))


def nvlink_weight(links: int) -> float:
    return NVLINK_SCALE / (links + 1)


def xgmi_weight(links: int) -> float:
    """xGMI weighs like NVLink of the same bandwidth: one MI300X link = 2 NVLink4 links -> 3.3."""
    return nvlink_weight(max(1, int(links * XGMI_GBPS_PER_LINK / NVLINK_GBPS_PER_LINK)))


def sys_weight(slit: int | None) -> float:
    """Farther sockets cost more; an unknown SLIT costs like a typical remote node."""
    extra = max(0, (slit if slit is not None else SLIT_REMOTE) - SLIT_REMOTE)
    return BASE_WEIGHTS["SYS"] + float(extra)


@record
class Distance:
    level: str
    weight: float
    links: int = 0  # NVLink links for NV / NVS
    slit: int | None = None  # SLIT distance for SYS

    @property
    def label(self) -> str:
        if self.level in ("NV", "NVS"):
            return f"{self.level}{self.links}"
        return self.level  # XGMI as rocm-smi --showtopo names the link type

    @property
    def local(self) -> bool:
        """Whether the pair stays inside one NUMA node (the seed's 'local link')."""
        return self.level != "SYS"


def pcie_distance(topology: Topology, a: PciDevice, b: PciDevice) -> Distance:
    """The PCIe/NUMA level of a pair, ignoring NVLink."""
    if a.address == b.address:
        return Distance("X", BASE_WEIGHTS["X"])
    if a.root_complex and a.root_complex == b.root_complex:  # "": outside any host bridge
        chain_a, chain_b = a.bridge_chain, b.bridge_chain
        common = 0
        while common < min(len(chain_a), len(chain_b)) and chain_a[common] == chain_b[common]:
            common += 1
        if common == 0:
            return Distance("PHB", BASE_WEIGHTS["PHB"])
        hops = (len(chain_a) - common) + (len(chain_b) - common) + 1
        level = "PIX" if hops <= 1 else "PXB"
        return Distance(level, BASE_WEIGHTS[level])
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return Distance("NODE", BASE_WEIGHTS["NODE"])
    slit = topology.slit(a.numa_node, b.numa_node)
    return Distance("SYS", sys_weight(slit), slit=slit)


@record(frozen=False)
class DistanceModel:
    """Distances between the host's devices, GPUs by index, corrected by measurements."""

    topology: Topology
    corrections: dict[tuple[str, str], float] = field(default_factory=dict)
    _devices: dict[str, PciDevice] = field(init=False)
    _gpu_address: dict[int, str] = field(init=False)
    _gpu_index: dict[str, int] = field(init=False)
    # Results derived from this model (the engine's host view); they die with it, so a
    # new model (new topology or corrections) can never be served a stale view.
    memo: dict = field(init=False, default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._devices = {device.address: device for device in self.topology.pci_devices}
        self._gpu_address = {gpu.index: gpu.address for gpu in self.topology.gpus}
        self._gpu_index = {gpu.address: gpu.index for gpu in self.topology.gpus}

    def between(self, address_a: str, address_b: str) -> Distance:
        a, b = self._devices.get(address_a), self._devices.get(address_b)
        gpu_index = self._gpu_index
        if address_a in gpu_index and address_b in gpu_index and address_a != address_b:
            nv = self._nvlink(gpu_index[address_a], gpu_index[address_b])
            if nv is not None:
                return self._corrected(address_a, address_b, nv)
        if a is None or b is None:
            # A device NVML reports but sysfs does not: nothing is known; assume the worst.
            return Distance("SYS", sys_weight(None))
        return self._corrected(address_a, address_b, pcie_distance(self.topology, a, b))

    def gpu_to_node(self, index: int, node_id: int) -> Distance:
        """A GPU and a NUMA node's CPUs and memory: C2C to its own CPU node when the GPU has
        NVLink-C2C, else PHB to its own node (PCIe through the host bridge), SYS across
        nodes (SLIT-weighted). A node holding the GPU's own memory counts as its CPU node."""
        gpu = next((g for g in self.topology.gpus if g.index == index), None)
        if gpu is None or gpu.numa_node is None:
            return Distance("SYS", sys_weight(None))
        near = node_id == gpu.numa_node or node_id == gpu.memory_numa_node
        if near and gpu.c2c is not None:
            return Distance("C2C", c2c_weight(gpu.c2c.bandwidth_gbps))
        if near:
            return Distance("PHB", BASE_WEIGHTS["PHB"])
        slit = self.topology.slit(gpu.numa_node, node_id)
        return Distance("SYS", sys_weight(slit), slit=slit)

    def gpus(self, index_a: int, index_b: int) -> Distance:
        return self.between(self._gpu_address[index_a], self._gpu_address[index_b])

    def _nvlink(self, a: int, b: int) -> Distance | None:
        fabric = self.topology.nvlink
        xgmi = fabric.xgmi_between(a, b) if fabric.xgmi else 0
        if xgmi:
            return Distance("XGMI", xgmi_weight(xgmi), links=xgmi)
        direct = fabric.links_between(a, b)
        island = fabric.island_of(a)
        via_switch = 0
        if island is not None and b in island:
            via_switch = min(fabric.island_links.get(a, 0), fabric.island_links.get(b, 0))
        if via_switch >= direct and via_switch > 0:
            return Distance("NVS", nvlink_weight(via_switch), links=via_switch)
        if direct > 0:
            return Distance("NV", nvlink_weight(direct), links=direct)
        return None

    def _corrected(self, a: str, b: str, distance: Distance) -> Distance:
        factor = self.corrections.get((a, b)) or self.corrections.get((b, a))
        if not factor or factor == 1.0:
            return distance
        return Distance(distance.level, distance.weight * factor, distance.links, distance.slit)

    def gpu_weight_matrix(self) -> list[list[float]]:
        """Pairwise weights, rows and columns in the order of topology.gpus."""
        indices = [gpu.index for gpu in self.topology.gpus]
        return [[self.gpus(i, j).weight for j in indices] for i in indices]
