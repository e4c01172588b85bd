"""`topoctl bind -- CMD`: a rank's entry point inside a lease (torchrun --no-python,
mpirun, srun). Reads the rank's local index (LOCAL_RANK, else OMPI_COMM_WORLD_LOCAL_RANK,
else SLURM_LOCALID, or --rank) and the lease's environment (TOPOD_GPU_CPUS, TOPOD_GPU_NODES,
TOPOD_GPU_MEMORY_NODES, CUDA_VISIBLE_DEVICES), pins itself to that rank's GPU's own
cores (sched_setaffinity: the whole cores the lease gave that GPU), binds memory to the
GPU's node (set_mempolicy MPOL_BIND; with --gpu-memory also the GPU's own memory node),
leaves CUDA_VISIBLE_DEVICES as the lease set it, narrows NCCL_IB_HCA and UCX_NET_DEVICES to
the rank's GPU's own NICs (TOPOD_GPU_NICS; left as they are when the lease has no NICs or
this GPU has none of its own), and execs CMD, which inherits all of it.

Rank r is the r-th GPU of the lease, the one CUDA numbers r under CUDA_VISIBLE_DEVICES.
In a lease without GPUs (TOPOD_GPUS empty) every rank is pinned to the whole lease's CPUs
(TOPOD_CPUS) and its memory bound to the lease's nodes (TOPOD_MEMORY_NODES); no rank is
needed.
A rank out of range, a GPU with no cores in the lease, or CPUs the kernel refuses is exit
2 with one line: never a silent fallback to the whole lease or to no pinning. A memory
binding the kernel cannot do is said on stderr and the command still runs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
USAGE = 2


class BindError(Exception):
    """What makes a rank unbindable; its message is the one line topoctl prints."""


@dataclass(frozen=True, slots=True)
class RankBinding:
    rank: int
    rank_source: str
    gpu: int | None  # None: a lease without GPUs (the rank gets the whole lease)
    cpus: tuple[int, ...]
    memory_nodes: tuple[int, ...]  # empty: the lease does not say the GPU's node
    visible_device: str  # what CUDA_VISIBLE_DEVICES names this GPU
    nic_environment: dict[str, str] = field(default_factory=dict)  # NCCL_IB_HCA/UCX_NET_DEVICES for this rank


def _per_gpu(text: str, variable: str) -> list[tuple[int, str]]:
    """'0:0-3;1:4-7' -> [(0, '0-3'), (1, '4-7')], in the lease's (CUDA's) order."""
    pairs = []
    for part in text.split(";"):
        if not part.strip():
            continue
        index, sep, value = part.partition(":")
        if not sep or not index.strip().isdecimal():
            raise BindError(f"{variable}={text!r}: expected GPU:VALUE pairs separated by ';'")
        pairs.append((int(index), value.strip()))
    return pairs


def _rank(env: dict[str, str], override: int | None) -> tuple[int, str]:
    if override is not None:
        return override, "--rank"
    for name in RANK_VARIABLES:
        value = env.get(name)
        if value is None or value == "":
            continue
        if not value.strip().isdecimal():
            raise BindError(f"{name}={value!r} is not a rank number")
        return int(value), name
    raise BindError(f"no local rank: set one of {', '.join(RANK_VARIABLES)} (the launcher does) or give --rank")


def rank_binding(env: dict[str, str], rank: int | None = None, gpu_memory: bool = False) -> RankBinding:
    """The binding of one rank from a lease's environment (pure: no system call)."""
    from topod.cpulist import parse_cpulist

    if env.get("TOPOD_GPUS") == "" and not env.get("TOPOD_GPU_CPUS") and env.get("TOPOD_CPUS"):
        return _cpu_lease_binding(env, rank)
    index, source = _rank(env, rank)
    gpu_cpus = env.get("TOPOD_GPU_CPUS")
    if not gpu_cpus:
        raise BindError("TOPOD_GPU_CPUS is not set: run inside a lease (topoctl run, or the environment of "
                        "topoctl allocate --json)")
    per_gpu = _per_gpu(gpu_cpus, "TOPOD_GPU_CPUS")
    if not 0 <= index < len(per_gpu):
        raise BindError(f"rank {index} ({source}) is out of range: the lease has {len(per_gpu)} GPU(s) "
                        f"(ranks 0-{len(per_gpu) - 1})")
    gpu, cpu_text = per_gpu[index]
    try:
        cpus = tuple(sorted(parse_cpulist(cpu_text)))
    except ValueError as exc:
        raise BindError(f"TOPOD_GPU_CPUS: GPU {gpu}: {exc}") from None
    if not cpus:
        raise BindError(f"rank {index}: GPU {gpu} has no cores in the lease (cpus_per_gpu 0?); "
                        "ask for CPUs with the lease, or run without topoctl bind")
    nodes: list[int] = []
    sources = [("TOPOD_GPU_NODES", env.get("TOPOD_GPU_NODES", ""))]
    if gpu_memory:
        sources.append(("TOPOD_GPU_MEMORY_NODES", env.get("TOPOD_GPU_MEMORY_NODES", "")))
    for variable, text in sources:
        for other, node in _per_gpu(text, variable):
            if other == gpu and node:
                if not node.isdecimal():
                    raise BindError(f"{variable}: GPU {gpu}: node {node!r} is not a number")
                if int(node) not in nodes:
                    nodes.append(int(node))
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    device = visible[index] if index < len(visible) else str(gpu)
    return RankBinding(index, source, gpu, cpus, tuple(nodes), device, _rank_nics(env, gpu))


def _cpu_lease_binding(env: dict[str, str], rank: int | None) -> RankBinding:
    """A lease without GPUs: the whole lease's CPUs and memory nodes, whatever the rank."""
    from topod.cpulist import parse_cpulist

    try:
        index, source = _rank(env, rank)
    except BindError:
        index, source = 0, "none (a lease without GPUs)"
    try:
        cpus = tuple(sorted(parse_cpulist(env["TOPOD_CPUS"])))
    except ValueError as exc:
        raise BindError(f"TOPOD_CPUS: {exc}") from None
    nodes = []
    for node in env.get("TOPOD_MEMORY_NODES", "").split(","):
        if not node.strip():
            continue
        if not node.strip().isdecimal():
            raise BindError(f"TOPOD_MEMORY_NODES: node {node!r} is not a number")
        nodes.append(int(node))
    return RankBinding(index, source, None, cpus, tuple(nodes), "")


def _rank_nics(env: dict[str, str], gpu: int) -> dict[str, str]:
    """NCCL_IB_HCA and UCX_NET_DEVICES narrowed to this GPU's NICs from TOPOD_GPU_NICS
    (topod.alloc.nics.rank_nic_environment, as topod.client.bind_local_rank does); empty
    when the lease has no NICs or lists none for this GPU."""
    text = env.get("TOPOD_GPU_NICS", "")
    if not text:
        return {}
    from topod.alloc.nics import rank_nic_environment  # only a lease with NICs pays for the import

    for other, nics in _per_gpu(text, "TOPOD_GPU_NICS"):
        for item in nics.split(",") if nics else ():  # "1:" is a GPU the lease gave no NIC
            name, _, port = item.strip().partition(":")
            if not name or (port and not port.isdecimal()):
                raise BindError(f"TOPOD_GPU_NICS: GPU {other}: {item!r} is not a NIC (expected NAME or NAME:PORT)")
    return rank_nic_environment(text, str(gpu))


def run_bind(args) -> int:  # noqa: ANN001 - argparse namespace
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("topoctl bind: no command given (topoctl bind -- CMD ...)", file=sys.stderr)
        return USAGE
    try:
        binding = rank_binding(dict(os.environ), args.rank, args.gpu_memory)
    except BindError as exc:
        print(f"topoctl bind: {exc}", file=sys.stderr)
        return USAGE
    from topod.pinning import pin_to

    try:
        _, warning = pin_to(binding.cpus)
    except OSError as exc:
        from topod.cpulist import format_cpulist

        owner = "the lease" if binding.gpu is None else f"GPU {binding.gpu}"
        print(f"topoctl bind: rank {binding.rank}: cannot pin to {owner}'s CPUs "
              f"{format_cpulist(binding.cpus)}: {exc.strerror or exc} (not on this host, or offline)", file=sys.stderr)
        return USAGE
    if warning:
        print(f"topoctl bind: rank {binding.rank}: WARNING: {warning}", file=sys.stderr)
    memory = "memory not bound: the lease does not name " + ("its nodes" if binding.gpu is None else "GPU's node")
    if binding.memory_nodes:
        from topod.membind import bind_memory

        try:
            bound = bind_memory(list(binding.memory_nodes))
            memory = f"memory bound to node(s) {','.join(map(str, binding.memory_nodes))}" if bound else \
                "memory not bound: set_mempolicy is unknown on this architecture"
        except OSError as exc:
            memory = f"memory not bound: {exc}"
        if not memory.startswith("memory bound"):
            print(f"topoctl bind: rank {binding.rank}: WARNING: {memory}", file=sys.stderr)
    else:
        print(f"topoctl bind: rank {binding.rank}: WARNING: {memory}", file=sys.stderr)
    from topod.cpulist import format_cpulist

    if binding.gpu is not None:
        os.environ["TOPOD_RANK_GPU"] = str(binding.gpu)
    os.environ.update(binding.nic_environment)
    if binding.gpu is not None and not binding.nic_environment and os.environ.get("TOPOD_GPU_NICS"):
        print(f"topoctl bind: rank {binding.rank}: GPU {binding.gpu} has no NIC of its own in the lease; "
              "NCCL_IB_HCA and UCX_NET_DEVICES left as the lease set them", file=sys.stderr)
    os.environ["TOPOD_RANK_CPUS"] = format_cpulist(binding.cpus)
    if args.verbose and binding.gpu is None:
        print(f"topoctl bind: rank {binding.rank} ({binding.rank_source}) -> the lease's CPUs "
              f"{format_cpulist(binding.cpus)} (a lease without GPUs), {memory}", file=sys.stderr)
    elif args.verbose:
        print(f"topoctl bind: rank {binding.rank} ({binding.rank_source}) -> GPU {binding.gpu} "
              f"(CUDA device {binding.rank}, {binding.visible_device}), CPUs {format_cpulist(binding.cpus)}, "
              f"{memory}, NIC {binding.nic_environment.get('UCX_NET_DEVICES', 'as the lease set it')}",
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        print(f"topoctl bind: {command[0]}: command not found", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"topoctl bind: {command[0]}: permission denied", file=sys.stderr)
        return 126
    return 1  # not reached: exec replaced this process
