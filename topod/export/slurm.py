"""Slurm gres.conf lines for the host's GPUs, in PCI bus order.

    Name=gpu Type=nvidia_h800 File=/dev/nvidia0 Cores=0-15 Links=-1,8,8,8,8,8,8,8

Cores= are Slurm's *logical core indices*, not Linux CPU ids: gres.conf(5) says core 0 is
the first core of the first socket, core 1 the second core of that socket, and so on
(the "Core L#" of `lstopo -l`); hyper-thread siblings share one index. So a GPU on NUMA
node 1 of a 2x16-core host gets Cores=16-31 even though its Linux CPUs are 16-31,48-63.

Links= is the row Slurm's NVML plugin would build: -1 for the GPU itself, then the
NVLink count to every other GPU in the order of the lines. Slurm's plugin counts only
links whose far end is a GPU, so on NVSwitch hosts it writes zeros and loses the fabric;
topod writes the NVSwitch links (the NVS# level of the distance model) instead.
Type= follows Slurm's AutoDetect: the NVML name, lowercased, spaces to underscores.
File= names the GPU's device minor (/proc/driver/nvidia/gpus/<bdf>/information, or NVML's
minor number), which the driver need not give in NVML index order; with AutoDetect=off a
wrong File= makes Slurm fence one GPU and hand out another. A GPU whose minor is unknown
falls back to its index, and the file says so in a comment (discovery warns
`gpu_minor_unknown`).

AMD GPUs are written as Slurm's gpu/rsmi plugin writes them: File= their render node
(/dev/dri/renderD<KFD's drm_render_minor>), Type= the model lowercased; Links= counts their
xGMI links, which that plugin leaves empty.
"""

from __future__ import annotations

from dataclasses import dataclass

from topod.cpulist import format_cpulist
from topod.distance import DistanceModel
from topod.errors import ConfigError
from topod.model import Gpu, Topology


@dataclass(frozen=True, slots=True)
class GresLine:
    file: str
    type: str | None  # None when the GPU's name is unknown: no Type= rather than a guess
    cores: tuple[int, ...]  # Slurm logical core indices; () when the GPU's NUMA node is unknown
    links: tuple[int, ...]
    node_name: str | None = None
    index: int | None = None  # the GPU's NVML index
    minor_known: bool = True  # False: File= fell back to the index

    def render(self) -> str:
        fields = [f"NodeName={self.node_name}"] if self.node_name else []
        fields.append("Name=gpu")
        if self.type:
            fields.append(f"Type={self.type}")
        fields.append(f"File={self.file}")
        if self.cores:
            fields.append(f"Cores={format_cpulist(list(self.cores))}")
        fields.append("Links=" + ",".join(str(n) for n in self.links))
        return " ".join(fields)


def gpu_type(name: str | None) -> str | None:
    """'NVIDIA H800' -> 'nvidia_h800', as Slurm's AutoDetect=nvml names it."""
    if not name or not name.strip():
        return None
    return "_".join(name.strip().lower().split())


def slurm_core_indices(topology: Topology) -> dict[int, int]:
    """Linux CPU id -> Slurm logical core index (socket-major, then by the core's first CPU)."""
    cores: dict[tuple[int, ...], int | None] = {}
    for cpu in topology.cpus:
        cores.setdefault(cpu.physical_core, cpu.package)
    packages = sorted({p for p in cores.values() if p is not None})
    rank = {package: i for i, package in enumerate(packages)}
    ordered = sorted(cores, key=lambda core: (rank.get(cores[core], len(rank)), min(core)))
    index: dict[int, int] = {}
    for number, core in enumerate(ordered):
        for cpu_id in core:
            index[cpu_id] = number
    return index


def gres_lines(
    topology: Topology,
    *,
    node_name: str | None = None,
    device_dir: str = "/dev",
    distances: DistanceModel | None = None,
) -> tuple[GresLine, ...]:
    """One line per GPU in PCI bus order; Links= columns follow the same order."""
    if node_name is not None:
        check_node_name(node_name)
    model = distances or DistanceModel(topology)
    gpus = sorted(topology.gpus, key=lambda gpu: gpu.address)
    core_of = slurm_core_indices(topology)
    lines = []
    for gpu in gpus:
        links = tuple(-1 if other.index == gpu.index else _links(model, gpu, other) for other in gpus)
        lines.append(
            GresLine(
                file=_device_file(device_dir, gpu),
                type=gpu_type(gpu.model if gpu.amd is not None else gpu.name),
                cores=_near_cores(topology, gpu, core_of),
                links=links,
                node_name=node_name,
                index=gpu.index,
                minor_known=gpu.minor is not None or gpu.amd is not None,
            )
        )
    return tuple(lines)


def _device_file(device_dir: str, gpu: Gpu) -> str:
    if gpu.amd is not None and gpu.amd.render_minor is not None:
        return f"{device_dir.rstrip('/')}/dri/renderD{gpu.amd.render_minor}"
    return f"{device_dir.rstrip('/')}/nvidia{gpu.device_number}"


def _links(model: DistanceModel, a: Gpu, b: Gpu) -> int:
    distance = model.gpus(a.index, b.index)
    return distance.links if distance.level in ("NV", "NVS", "XGMI") else 0


def _near_cores(topology: Topology, gpu: Gpu, core_of: dict[int, int]) -> tuple[int, ...]:
    node = topology.node(gpu.numa_node) if gpu.numa_node is not None else None
    if node is None:
        return ()
    # A GPU on a CPU-less node is nearest to that node's local_cpus (the closest CPUs).
    cpus = node.cpus or node.local_cpus
    return tuple(sorted({core_of[cpu] for cpu in cpus if cpu in core_of}))


def check_node_name(name: str) -> None:
    """ConfigError for a NodeName that would break gres.conf's one-line, space-separated
    key=value format (a space, '=', '#', a control character: a newline would add lines)."""
    if not name or any(ch.isspace() or ch in "=#" or not ch.isprintable() for ch in name):
        raise ConfigError(f"export slurm-gres: {name!r} cannot be a NodeName in gres.conf (no spaces, '=', '#' "
                          "or control characters)")


def render_gres_conf(
    topology: Topology,
    *,
    node_name: str | None = None,
    device_dir: str = "/dev",
    autodetect_off: bool = True,
) -> str:
    """The gres.conf text: a header saying where it came from, then one line per GPU."""
    lines = gres_lines(topology, node_name=node_name, device_dir=device_dir)
    out = [
        "# gres.conf written by topod (topoctl export slurm-gres); Cores= are Slurm logical core",
        "# indices, Links= NVLink counts (NVSwitch included) in the order of these lines.",
    ]
    if any(gpu.amd is not None for gpu in topology.gpus):
        out.append("# AMD GPUs: File= their render node (KFD's drm_render_minor), Links= their xGMI links")
    if not lines:
        out.append("# this host has no GPUs topod can see")
        return "\n".join(out) + "\n"
    if any(line.type is None for line in lines):
        out.append("# some GPU names are unknown (no NVML): those lines have no Type=")
    guessed = [line.index for line in lines if not line.minor_known]
    if guessed:
        out.append(f"# WARNING gpu_minor_unknown: device minors of GPU(s) {','.join(map(str, guessed))} unknown "
                   "(no /proc/driver/nvidia/gpus, no NVML): File= uses the NVML index; check `ls -l /dev/nvidia*`")
    if any(not line.cores for line in lines):
        out.append("# some GPUs have no known NUMA node: those lines have no Cores=")
    if autodetect_off:
        # Otherwise AutoDetect=nvml (if configured) would replace these Links= with its zeros.
        out.append("AutoDetect=off" if node_name is None else f"NodeName={node_name} AutoDetect=off")
    out.extend(line.render() for line in lines)
    return "\n".join(out) + "\n"
