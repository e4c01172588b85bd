"""What doctor reads about processes and interrupts, through the host root.

Each /proc file has one small parser that takes text and tolerates missing fields
(psutil's lesson); the readers glue them to a HostRoot and record every file they read,
so each finding can name its evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from topod.cpulist import parse_cpulist
from topod.host import HostRoot

# Environment variables that decide which GPUs and NICs a rank uses. Only these are
# kept: a process's environment may hold secrets, and doctor prints what it keeps.
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK",
             "WORLD_SIZE", "OMP_NUM_THREADS", "UCX_NET_DEVICES", "TOPOD_GPU_NICS", "ROCR_VISIBLE_DEVICES",
             "HIP_VISIBLE_DEVICES")
ENV_PREFIXES = ("NCCL_",)
# The most of /proc/PID/environ doctor reads. The kernel lets argv + envp take a quarter of
# the stack limit (2 MiB at the usual 8 MiB); a bigger one is not read and the process's
# NICs are "not checked" (HostRoot records why).
ENVIRON_CAP = 4 * 1024 * 1024

# /proc/PID/task/TID/stat field 39 (1-based) is 'processor', the CPU it last ran on.
STAT_PROCESSOR_FIELD = 39
_GPU_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")
_NUMA_PAGES = re.compile(r"^N(\d+)=(\d+)$")


@dataclass(frozen=True, slots=True)
class StatusFacts:
    name: str | None
    cpus_allowed: tuple[int, ...] | None
    mems_allowed: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class ThreadFacts:
    tid: int
    processor: int | None


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """One process as doctor sees it; None means the file was missing or unreadable."""

    pid: int
    name: str | None
    cmdline: tuple[str, ...]
    cpus_allowed: tuple[int, ...] | None
    mems_allowed: tuple[int, ...] | None
    threads: tuple[ThreadFacts, ...]
    memory_kib: dict[int, int]  # NUMA node -> resident KiB, from numa_maps
    env: dict[str, str]
    gpu_minors: tuple[int, ...]  # N of each /dev/nvidiaN it holds open
    files_read: tuple[str, ...]
    unreadable: tuple[str, ...] = ()
    nvml_gpus: tuple[int, ...] = ()  # GPU indices NVML lists it on (live root only)

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else f"[{self.name or self.pid}]"

    @property
    def last_cpus(self) -> tuple[int, ...]:
        return tuple(sorted({t.processor for t in self.threads if t.processor is not None}))


# ---------------------------------------------------------------- parsers (text in)


def parse_status(text: str) -> StatusFacts:
    """/proc/PID/status: Name, Cpus_allowed_list, Mems_allowed_list (each may be absent)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return StatusFacts(
        name=fields.get("Name"),
        cpus_allowed=_cpulist_or_none(fields.get("Cpus_allowed_list")),
        mems_allowed=_cpulist_or_none(fields.get("Mems_allowed_list")),
    )


def _cpulist_or_none(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(parse_cpulist(text))
    except ValueError:
        return None


def parse_stat_processor(text: str) -> int | None:
    """The 'processor' field of a /proc/.../stat line; None on an old kernel or garbage.

    comm (field 2) may hold spaces and parentheses, so split after its last ')'."""
    _, sep, rest = text.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    index = STAT_PROCESSOR_FIELD - 3  # rest starts at field 3 (state)
    if len(fields) <= index:
        return None
    try:
        return int(fields[index])
    except ValueError:
        return None


def parse_numa_maps(text: str) -> dict[int, int]:
    """/proc/PID/numa_maps -> {node: KiB}: N<node>=<pages> per mapping, times its page size."""
    totals: dict[int, int] = {}
    for line in text.splitlines():
        tokens = line.split()
        page_kib = 4
        counts: list[tuple[int, int]] = []
        for token in tokens[2:]:
            if token.startswith("kernelpagesize_kB="):
                try:
                    page_kib = int(token.split("=", 1)[1])
                except ValueError:
                    pass
                continue
            match = _NUMA_PAGES.match(token)
            if match:
                counts.append((int(match.group(1)), int(match.group(2))))
        for node, pages in counts:
            totals[node] = totals.get(node, 0) + pages * page_kib
    return totals


def parse_environ(text: str) -> dict[str, str]:
    """NUL-separated NAME=value pairs -> only the GPU/NCCL placement variables."""
    kept: dict[str, str] = {}
    for entry in text.split("\0"):
        name, sep, value = entry.partition("=")
        if sep and (name in ENV_NAMES or name.startswith(ENV_PREFIXES)):
            kept[name] = value
    return kept


def parse_cmdline(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split("\0") if part)


def gpu_minor_of_link(target: str | None) -> int | None:
    """'/dev/nvidia3' -> 3; None for /dev/nvidiactl, /dev/nvidia-uvm and anything else."""
    if not target:
        return None
    match = _GPU_DEVICE.match(target)
    return int(match.group(1)) if match else None


def parse_interrupts(text: str) -> dict[int, dict[int, int]]:
    """/proc/interrupts -> {irq: {cpu: count}} for numbered lines (NMI, LOC... skipped)."""
    lines = text.splitlines()
    if not lines:
        return {}
    cpus = [int(name[3:]) for name in lines[0].split() if name.startswith("CPU") and name[3:].isdigit()]
    table: dict[int, dict[int, int]] = {}
    for line in lines[1:]:
        label, sep, rest = line.partition(":")
        if not sep or not label.strip().isdigit():
            continue
        values = rest.split()
        counts: dict[int, int] = {}
        for cpu, value in zip(cpus, values):
            if not value.isdigit():
                break
            counts[cpu] = int(value)
        table[int(label)] = counts
    return table


def interrupt_rates(before: str, after: str, seconds: float) -> dict[int, dict[int, float]]:
    """Per-IRQ, per-CPU interrupts per second between two /proc/interrupts snapshots."""
    if seconds <= 0:
        raise ValueError(f"IRQ sampling interval must be > 0 s, got {seconds}")
    first, second = parse_interrupts(before), parse_interrupts(after)
    rates: dict[int, dict[int, float]] = {}
    for irq, counts in second.items():
        old = first.get(irq, {})
        # A counter that went backwards (IRQ freed and reused) counts as no data, not negative.
        rates[irq] = {cpu: max(0, value - old.get(cpu, value)) / seconds for cpu, value in counts.items()}
    return rates


# ---------------------------------------------------------------- readers (HostRoot)


@dataclass(slots=True)
class _Trail:
    read: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def text(self, host: HostRoot, rel: str, limit: int | None = None) -> str | None:
        value = host.read(rel, limit=limit)
        (self.read if value is not None else self.missing).append("/" + rel.lstrip("/"))
        return value


def read_process(host: HostRoot, pid: int) -> ProcessFacts | None:
    """Everything doctor uses about one process; None when /proc/PID does not exist."""
    base = f"proc/{pid}"
    if not host.is_dir(base):
        return None
    trail = _Trail()
    status_text = trail.text(host, f"{base}/status")
    status = parse_status(status_text) if status_text is not None else StatusFacts(None, None, None)
    cmdline_text = trail.text(host, f"{base}/cmdline")
    numa_text = trail.text(host, f"{base}/numa_maps")
    environ_text = trail.text(host, f"{base}/environ", ENVIRON_CAP)
    threads = []
    for name in host.listdir(f"{base}/task"):
        if name.isdigit():
            stat = trail.text(host, f"{base}/task/{name}/stat")
            threads.append(ThreadFacts(int(name), parse_stat_processor(stat) if stat is not None else None))
    minors = read_gpu_fds(host, pid)
    if host.is_dir(f"{base}/fd"):
        trail.read.append(f"/{base}/fd/*")
    return ProcessFacts(
        pid=pid,
        name=status.name,
        cmdline=parse_cmdline(cmdline_text) if cmdline_text is not None else (),
        cpus_allowed=status.cpus_allowed,
        mems_allowed=status.mems_allowed,
        threads=tuple(sorted(threads, key=lambda t: t.tid)),
        memory_kib=parse_numa_maps(numa_text) if numa_text is not None else {},
        env=parse_environ(environ_text) if environ_text is not None else {},
        gpu_minors=minors,
        files_read=tuple(trail.read),
        unreadable=tuple(trail.missing),
    )


def read_gpu_fds(host: HostRoot, pid: int) -> tuple[int, ...]:
    """Minor numbers of the /dev/nvidiaN files a process holds open.

    readlink, not resolve: the link text names the device on the host being examined,
    and resolving '/dev/nvidia0' under a captured tree would leave the tree."""
    minors = set()
    for fd in host.listdir(f"proc/{pid}/fd"):
        minor = gpu_minor_of_link(host.readlink(f"proc/{pid}/fd/{fd}"))
        if minor is not None:
            minors.add(minor)
    return tuple(sorted(minors))


def list_pids(host: HostRoot) -> list[int]:
    return sorted(int(name) for name in host.listdir("proc") if name.isdigit())


def gpu_processes(host: HostRoot) -> list[int]:
    """PIDs holding a /dev/nvidiaN open (works on captured trees and without NVML)."""
    return [pid for pid in list_pids(host) if read_gpu_fds(host, pid)]


def read_gpu_minor_map(host: HostRoot) -> dict[int, str]:
    """Device minor -> PCI address from /proc/driver/nvidia/gpus/<bdf>/information.

    The minor of /dev/nvidiaN need not equal NVML's index; the driver's own file says
    which it is. Empty when the driver is absent (captured trees, no GPU)."""
    from topod.discover.gpuminor import read_driver_minors

    return {minor: address for address, minor in read_driver_minors(host).items()}


def read_irq_affinity(host: HostRoot, irqs: list[int]) -> dict[int, tuple[tuple[int, ...], str]]:
    """IRQ -> (CPUs it is delivered to, file that said so).

    effective_affinity_list is where the kernel actually delivers; smp_affinity_list is
    only what was asked for, so it is the fallback on kernels without the former."""
    found: dict[int, tuple[tuple[int, ...], str]] = {}
    for irq in irqs:
        for name in ("effective_affinity_list", "smp_affinity_list"):
            rel = f"/proc/irq/{irq}/{name}"
            cpus = _cpulist_or_none(host.read(rel) or "")
            if cpus:
                found[irq] = (cpus, rel)
                break
    return found


def nvml_processes() -> tuple[dict[int, tuple[int, ...]], str | None]:
    """Live root only: pid -> NVML GPU indices it runs compute/graphics on.

    Returns ({}, reason) when NVML is not importable or not usable, so the caller can say
    that it fell back to /dev/nvidia* file handles alone."""
    try:
        import pynvml  # lazy: heavy, and absent on hosts without the driver
    except ImportError:
        return {}, "pynvml is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError subclasses vary by driver version
        return {}, f"NVML unavailable: {exc}"
    found: dict[int, set[int]] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for getter in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                           pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    for process in getter(handle):
                        found.setdefault(int(process.pid), set()).add(index)
                except pynvml.NVMLError:
                    continue
    finally:
        pynvml.nvmlShutdown()
    return {pid: tuple(sorted(gpus)) for pid, gpus in found.items()}, None
