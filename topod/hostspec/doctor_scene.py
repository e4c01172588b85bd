"""Write /proc/PID/... trees into a host tree, for doctor's tests and the demo.

The files are in the kernel's own formats (status, task/TID/stat with 52 fields,
numa_maps, NUL-separated environ and cmdline, fd/N links to /dev/nvidiaN), so the
readers under test are the ones that run on a real host.

    python -m topod.hostspec.doctor_scene DIR    # h800-8gpu with an 8-rank job, rank 3 misplaced
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from topod.cpulist import format_cpulist
from topod.model import Topology

STAT_FIELDS = 52
PAGE_KIB = 4


@dataclass(frozen=True, slots=True)
class ProcSpec:
    pid: int
    name: str
    cmdline: tuple[str, ...]
    cpus_allowed: tuple[int, ...]
    threads: tuple[int, ...]  # the CPU each thread last ran on; the first is the main thread
    memory_mib: dict[int, int] = field(default_factory=dict)  # NUMA node -> resident MiB
    gpus: tuple[int, ...] = ()  # /dev/nvidiaN it holds open
    env: dict[str, str] = field(default_factory=dict)
    mems_allowed: tuple[int, ...] = (0,)

    @property
    def tids(self) -> list[int]:
        return [self.pid + i for i in range(len(self.threads))]


def stat_line(tid: int, comm: str, processor: int) -> str:
    fields = ["0"] * (STAT_FIELDS + 1)  # 1-based
    fields[1], fields[2], fields[3] = str(tid), f"({comm})", "S"
    fields[39] = str(processor)
    return " ".join(fields[1:]) + "\n"


def numa_maps_text(memory_mib: dict[int, int]) -> str:
    """Two mappings (heap and an anonymous arena) sharing the pages between nodes."""
    pages = {node: mib * 1024 // PAGE_KIB for node, mib in memory_mib.items() if mib > 0}
    if not pages:
        return "7f0000000000 default file=/usr/lib/libc.so.6 mapped=1 N0=1 kernelpagesize_kB=4\n"
    half = {n: p // 2 for n, p in pages.items()}
    rest = {n: p - half[n] for n, p in pages.items()}

    def line(address: str, what: str, counts: dict[int, int]) -> str:
        total = sum(counts.values())
        nodes = " ".join(f"N{n}={c}" for n, c in sorted(counts.items()) if c)
        return f"{address} default {what} anon={total} dirty={total} {nodes} kernelpagesize_kB={PAGE_KIB}\n"

    return (line("55d4c0a00000", "heap", half) + line("7f3a00000000", "anon", rest)
            + "7f3b00000000 default file=/usr/lib/libcuda.so.1 mapped=12 mapmax=2 N0=12 kernelpagesize_kB=4\n")


def write_process(root: str | os.PathLike[str], spec: ProcSpec) -> None:
    base = Path(root) / "proc" / str(spec.pid)
    (base / "task").mkdir(parents=True, exist_ok=True)
    (base / "status").write_text(
        f"Name:\t{spec.name}\nState:\tS (sleeping)\nTgid:\t{spec.pid}\nPid:\t{spec.pid}\n"
        f"Threads:\t{len(spec.threads)}\nCpus_allowed_list:\t{format_cpulist(spec.cpus_allowed)}\n"
        f"Mems_allowed_list:\t{format_cpulist(spec.mems_allowed)}\n")
    (base / "cmdline").write_text("\0".join(spec.cmdline) + "\0")
    env = {"PATH": "/usr/bin", "HOME": "/home/user", "AWS_SECRET_ACCESS_KEY": "not-for-doctor", **spec.env}
    (base / "environ").write_text("".join(f"{k}={v}\0" for k, v in env.items()))
    (base / "numa_maps").write_text(numa_maps_text(spec.memory_mib))
    for tid, cpu in zip(spec.tids, spec.threads):
        (base / "task" / str(tid)).mkdir(exist_ok=True)
        (base / "task" / str(tid) / "stat").write_text(stat_line(tid, spec.name, cpu))
    fd = base / "fd"
    fd.mkdir(exist_ok=True)
    targets = ["/dev/null", "/dev/null", "/dev/null", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    targets += [f"/dev/nvidia{g}" for g in spec.gpus]
    for number, target in enumerate(targets):
        link = fd / str(number)
        if link.is_symlink():
            link.unlink()
        os.symlink(target, link)


def set_isolated(root: str | os.PathLike[str], cpus: list[int]) -> None:
    (Path(root) / "sys/devices/system/cpu/isolated").write_text(format_cpulist(cpus) + "\n")


def place_irqs(root: str | os.PathLike[str], irqs: list[int] | tuple[int, ...], cpus: list[int]) -> None:
    """Set where the kernel delivers these IRQs (effective) and where they were asked to go."""
    for irq in irqs:
        folder = Path(root) / "proc/irq" / str(irq)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "smp_affinity_list").write_text(format_cpulist(cpus) + "\n")
        (folder / "effective_affinity_list").write_text(f"{min(cpus)}\n")


# ---------------------------------------------------------------- scenarios


def physical_cores(topology: Topology, node: int) -> list[tuple[int, ...]]:
    """The node's physical cores as sibling tuples, lowest CPU first."""
    seen: dict[tuple[int, ...], None] = {}
    for cpu in topology.cpus:
        if cpu.online and cpu.numa_node == node:
            seen.setdefault(cpu.physical_core, None)
    return sorted(seen, key=lambda core: core[0])


def rank_cpus(topology: Topology, node: int, slot: int, cores: int = 3) -> list[int]:
    """CPUs (both hyper-threads) of `cores` physical cores for the slot-th rank of a node;
    slot -1 takes the node's last cores (a stray rank that collides with no local one).

    Core 0 of each node is left for housekeeping and IRQs, as the seed's layout does."""
    available = physical_cores(topology, node)
    chosen = available[-cores:] if slot < 0 else available[1 + slot * cores: 1 + (slot + 1) * cores]
    return sorted(c for core in chosen for c in core)


def _rank(topology: Topology, pid: int, gpu: int, cpu_node: int, memory: dict[int, int], slot: int,
          rank: int | None = None) -> ProcSpec:
    cpus = rank_cpus(topology, cpu_node, slot)
    rank = gpu if rank is None else rank
    threads = tuple(cpus[i % len(cpus)] for i in range(6))
    env = {"CUDA_VISIBLE_DEVICES": str(gpu), "LOCAL_RANK": str(rank)}
    nic = nearest_nic(topology, gpu)
    if nic is not None:  # the rank sends through its GPU's own NIC, as a lease would say
        env["NCCL_IB_HCA"] = f"={nic.name}:{nic.port}"
    return ProcSpec(pid, "python3", ("python3", "train.py", "--local-rank", str(rank)), tuple(cpus), threads,
                    memory, (topology.gpu(gpu).device_number,), env,
                    mems_allowed=tuple(n.id for n in topology.numa_nodes))


def _nics_by_level(topology: Topology, gpu: int) -> list[tuple[float, str, object]]:
    """The host's offered NIC ports (ACTIVE) by distance level from the GPU, nearest first."""
    from topod.alloc.nics import offered_nics
    from topod.distance import BASE_WEIGHTS, DistanceModel

    model = DistanceModel(topology)
    address = topology.gpu(gpu).address
    ranked = []
    for nic in offered_nics(topology):
        label = model.between(address, nic.address).label
        ranked.append((BASE_WEIGHTS.get(label, BASE_WEIGHTS["SYS"]), label, nic))
    return sorted(ranked, key=lambda item: (item[0], item[2].address, item[2].port))


def nearest_nic(topology: Topology, gpu: int):  # noqa: ANN201 - topod.alloc.nics.Nic, imported lazily
    """The GPU's nearest offered NIC port, or None on a host without one."""
    ranked = _nics_by_level(topology, gpu)
    return ranked[0][2] if ranked else None


def nic_at(topology: Topology, gpu: int, level: str):  # noqa: ANN201
    """The first offered NIC port at this distance level from the GPU (PIX, PHB, NODE, SYS).
    ValueError when the host has none there: a scene never invents hardware."""
    found = [nic for _, label, nic in _nics_by_level(topology, gpu) if label == level]
    if not found:
        raise ValueError(f"GPU {gpu} has no RDMA NIC at level {level} on this host")
    return found[0]


def nic_env_rank(topology: Topology, pid: int, gpu: int, env: dict[str, str]) -> ProcSpec:
    """A well-placed rank whose NCCL/UCX NIC variables are exactly `env` (none when empty)."""
    spec = well_placed_rank(topology, pid, gpu)
    kept = {k: v for k, v in spec.env.items() if k not in ("NCCL_IB_HCA", "UCX_NET_DEVICES")}
    return ProcSpec(spec.pid, spec.name, spec.cmdline, spec.cpus_allowed, spec.threads, spec.memory_mib,
                    spec.gpus, {**kept, **env}, spec.mems_allowed)


def far_nic_rank(topology: Topology, pid: int, gpu: int, level: str = "SYS") -> ProcSpec:
    """A rank beside its GPU whose NCCL_IB_HCA names a NIC at `level` (another node by default)."""
    nic = nic_at(topology, gpu, level)
    return nic_env_rank(topology, pid, gpu, {"NCCL_IB_HCA": f"={nic.name}:{nic.port}"})


def _slot(topology: Topology, gpu: int) -> tuple[int, int]:
    node = topology.gpu(gpu).numa_node or 0
    peers = [g.index for g in topology.gpus if g.numa_node == node]
    return node, peers.index(gpu)


def well_placed_rank(topology: Topology, pid: int, gpu: int) -> ProcSpec:
    node, slot = _slot(topology, gpu)
    return _rank(topology, pid, gpu, node, {node: 2048}, slot)


def far_socket_rank(topology: Topology, pid: int, gpu: int) -> ProcSpec:
    """Threads and memory on another NUMA node than the GPU (first-touch follows the CPU)."""
    node, _ = _slot(topology, gpu)
    far = next(n.id for n in topology.numa_nodes if n.id != node and n.has_cpus)
    return _rank(topology, pid, gpu, far, {far: 2048}, -1)


def wrong_node_memory_rank(topology: Topology, pid: int, gpu: int) -> ProcSpec:
    """Threads beside the GPU, but most memory on the far node (numactl --membind=1 gone wrong)."""
    node, slot = _slot(topology, gpu)
    far = next(n.id for n in topology.numa_nodes if n.id != node)
    return _rank(topology, pid, gpu, node, {node: 256, far: 1792}, slot)


def migrating_rank(topology: Topology, pid: int, gpu: int) -> ProcSpec:
    """Running beside its GPU for now, but allowed on every CPU of the host."""
    spec = well_placed_rank(topology, pid, gpu)
    return ProcSpec(spec.pid, spec.name, spec.cmdline, topology.online_cpus, spec.threads, spec.memory_mib,
                    spec.gpus, spec.env, spec.mems_allowed)


def isolated_misuse_rank(topology: Topology, pid: int, gpu: int, isolated: list[int]) -> ProcSpec:
    """Allowed on the isolated CPUs, with all six threads stacked on the first of them."""
    node, _ = _slot(topology, gpu)
    return ProcSpec(pid, "python3", ("python3", "serve.py"), tuple(isolated), tuple([isolated[0]] * 6),
                    {node: 1024}, (gpu,), {"CUDA_VISIBLE_DEVICES": str(gpu)})


def ht_split_pair(topology: Topology, pid_a: int, pid_b: int, gpu_a: int, gpu_b: int) -> tuple[ProcSpec, ProcSpec]:
    """Two jobs on one node, job A on the first hyper-thread of three cores, job B on the second."""
    node, _ = _slot(topology, gpu_a)
    cores = physical_cores(topology, node)[1:4]
    first, second = tuple(c[0] for c in cores), tuple(c[-1] for c in cores)
    a = ProcSpec(pid_a, "python3", ("python3", "a.py"), first, first, {node: 512}, (gpu_a,))
    b = ProcSpec(pid_b, "python3", ("python3", "b.py"), second, second, {node: 512}, (gpu_b,))
    return a, b


def spread_job(topology: Topology, pid: int, gpus: tuple[int, ...]) -> ProcSpec:
    """One process driving GPUs on two NUMA nodes, allowed on both nodes' CPUs."""
    nodes = sorted({topology.gpu(g).numa_node or 0 for g in gpus})
    cpus = tuple(c for n in nodes for c in rank_cpus(topology, n, 0))
    return ProcSpec(pid, "python3", ("python3", "dp.py"), cpus, cpus[:4], {n: 512 for n in nodes}, gpus,
                    {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}, tuple(nodes))


def demo_job(topology: Topology, first_pid: int = 4100) -> list[ProcSpec]:
    """An 8-rank job, one rank per GPU, with rank 3 on the far socket."""
    specs = []
    for gpu in topology.gpus:
        pid = first_pid + 10 * gpu.index
        specs.append(far_socket_rank(topology, pid, gpu.index) if gpu.index == 3
                     else well_placed_rank(topology, pid, gpu.index))
    return specs


def build_demo(root: str | os.PathLike[str]) -> list[ProcSpec]:
    """The h800-8gpu host tree with demo_job's processes written into it."""
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host, load_builtin_spec

    build_host(load_builtin_spec("h800-8gpu"), root)
    specs = demo_job(discover(HostRoot(root)))
    for spec in specs:
        write_process(root, spec)
    return specs


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m topod.hostspec.doctor_scene DIR")
    written = build_demo(sys.argv[1])
    print(f"wrote h800-8gpu with {len(written)} ranks under {sys.argv[1]} (rank 3 on the far socket)")
