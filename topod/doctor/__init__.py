"""topoctl doctor: is each GPU process running, allocating and interrupted where its GPUs are?

`diagnose` is the thin shell: it reads processes and IRQ affinities through a HostRoot,
takes lease and IRQ-plan data as plain values (the daemon's API supplies them; without a
daemon there are none), and hands everything to the pure rules in findings.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from topod.doctor.context import daemon_setup_from_health
from topod.doctor.findings import DoctorInputError, DoctorSettings, Finding, IrqLine, Lease, lease_from_dict
from topod.doctor.procs import (
    gpu_processes,
    interrupt_rates,
    nvml_processes,
    read_gpu_minor_map,
    read_irq_affinity,
    read_process,
)
from topod.doctor.report import DoctorInputs, DoctorReport, build_report, render_text, report_to_json
from topod.host import HostRoot
from topod.model import PciDevice, Topology

IRQ_KINDS = ("rdma", "nvme", "nic")

__all__ = ["DoctorInputError", "DoctorReport", "DoctorSettings", "Finding", "Lease", "diagnose",
           "parse_irq_plan", "render_text", "report_to_json"]

# (before, after, seconds): two /proc/interrupts snapshots and the time between them.
InterruptSample = tuple[str, str, float]


def diagnose(
    host: HostRoot,
    topology: Topology,
    *,
    pids: Iterable[int] | None = None,
    leases: Iterable[Mapping[str, object]] | None = None,
    irq_plan: Mapping[object, object] | None = None,
    interrupts: InterruptSample | None = None,
    settings: DoctorSettings | None = None,
    use_nvml: bool | None = None,
    daemon_health: Mapping[str, object] | None = None,
) -> DoctorReport:
    """Diagnose the given PIDs, or every process holding a GPU open.

    leases: [{id, owner, gpus, cpus, pids}] or None when no daemon answered (then rules
    that need them say so). irq_plan: {irq: [cpu, ...]}, where topod's IRQ plan puts each
    vector. use_nvml: ask NVML for GPU processes too; default: only on a live root.
    daemon_health: GET /v1/health of the daemon serving this root (its IRQ mode and
    isolation are checked against the leases it holds)."""
    notes: list[str] = []
    lease_values = tuple(lease_from_dict(item) for item in leases) if leases is not None else ()
    if leases is None:
        notes.append("no lease data (no daemon): lease-aware checks judge by affinity alone")
    nvml: dict[int, tuple[int, ...]] = {}
    if use_nvml if use_nvml is not None else host.is_live:
        nvml, reason = nvml_processes()
        if reason:
            notes.append(f"{reason}: GPU users found from /proc/*/fd only")
    users = set(gpu_processes(host)) | set(nvml)
    wanted = sorted(set(pids)) if pids is not None else sorted(users)
    processes, others = [], []
    for pid in sorted(set(wanted) | users):
        facts = read_process(host, pid)
        if facts is None:
            if pid in wanted and pids is not None:
                raise DoctorInputError(f"--pid {pid}: no such process under {host.root}/proc")
            continue
        if pid in nvml:
            facts = replace(facts, nvml_gpus=nvml[pid])
        (processes if pid in wanted else others).append(facts)
    plan = parse_irq_plan(irq_plan) if irq_plan is not None else {}
    rates = interrupt_rates(*interrupts) if interrupts is not None else None
    if rates is None:
        notes.append("IRQ rates not sampled (one snapshot): IRQ findings judge by affinity only")
    minors = read_gpu_minor_map(host)
    guessed = [gpu.index for gpu in topology.gpus if gpu.minor is None]
    if not minors and guessed:
        notes.append(f"gpu_minor_unknown: no /proc/driver/nvidia/gpus and no NVML minor for GPU(s) "
                     f"{','.join(map(str, guessed))}: /dev/nvidiaN taken to be GPU index N")
    inputs = DoctorInputs(
        leases=lease_values,
        leases_known=leases is not None,
        irqs=tuple(irq_lines(host, topology, plan, rates)),
        rates_known=rates is not None,
        minor_map=minors,
        settings=settings or DoctorSettings(),
        notes=tuple(notes),
        daemon=daemon_setup_from_health(daemon_health) if daemon_health is not None else None,
    )
    return build_report(str(host.root), topology, processes, inputs, others)


def irq_lines(host: HostRoot, topology: Topology, plan: dict[int, tuple[int, ...]],
              rates: dict[int, dict[int, float]] | None) -> list[IrqLine]:
    lines = []
    for device in topology.devices_of_kind(*IRQ_KINDS):
        affinity = read_irq_affinity(host, list(device.msi_irqs))
        for irq in device.msi_irqs:
            if irq not in affinity:
                continue
            cpus, source = affinity[irq]
            lines.append(IrqLine(irq, device.address, device.kind, device_name(device), cpus, source,
                                 rates.get(irq, {}) if rates is not None else None, plan.get(irq)))
    return lines


def device_name(device: PciDevice) -> str:
    """The name a person knows the device by: mlx5_0 before ibp0s0, nvme0, ens0f0."""
    for prefix in ("mlx5_", "nvme", ""):
        for name in device.names:
            if name.startswith(prefix):
                return name
    return device.address


def parse_irq_plan(plan: Mapping[object, object]) -> dict[int, tuple[int, ...]]:
    """{irq: [cpus]} (keys may be JSON strings) -> {int: (cpus)}; DoctorInputError otherwise."""
    parsed: dict[int, tuple[int, ...]] = {}
    for key, value in plan.items():
        try:
            irq = int(str(key))
        except ValueError:
            raise DoctorInputError(f"IRQ plan key {key!r} is not an IRQ number") from None
        if not isinstance(value, list | tuple) or not all(isinstance(c, int) and c >= 0 for c in value):
            raise DoctorInputError(f"IRQ plan for IRQ {irq}: expected a list of CPU numbers, got {value!r}")
        parsed[irq] = tuple(sorted(set(value)))
    return parsed
