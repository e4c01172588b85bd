"""Doctor's report: resolve each process into a job, run the rules, and say it to a person
(text) or a program (JSON). Pure: the facts come in as values."""

from __future__ import annotations

from dataclasses import dataclass, field

from topod.cpulist import format_cpulist
from topod.doctor.visible import rocm_visible
from topod.doctor.findings import (
    PROCESS_RULES,
    SEVERITIES,
    DoctorSettings,
    Finding,
    HostContext,
    IrqLine,
    Job,
    Lease,
    daemon_not_keeping_leases,
    gpus_spread,
    irqs_on_isolated,
    irqs_on_leased_cpus,
)
from topod.doctor.context import DaemonSetup
from topod.doctor.nics import NOT_CHECKED, check_nics
from topod.doctor.procs import ProcessFacts
from topod.distance import DistanceModel
from topod.model import Topology

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class ProcessReport:
    job: Job
    findings: tuple[Finding, ...]
    nic_status: str = "none"  # ok | finding | not_checked | none (topod.doctor.nics)

    @property
    def placement_known(self) -> bool:
        """Whether anything says where it runs or keeps memory: no finding means "fine"
        only then."""
        process = self.job.process
        return bool(process.last_cpus or process.memory_kib or process.cpus_allowed)

    @property
    def fully_checked(self) -> bool:
        """Placement known, and its NICs judged where the host has any to judge."""
        return self.placement_known and self.nic_status != NOT_CHECKED

    def to_json(self, topology: Topology) -> dict[str, object]:
        process = self.job.process
        return {
            "pid": process.pid,
            "name": process.name,
            "command": list(process.cmdline),
            "gpus": [{"index": i, "numa_node": g.numa_node if (g := topology.gpu(i)) else None} for i in self.job.gpus],
            "gpu_source": self.job.gpu_source,
            "lease": self.job.lease.id if self.job.lease else None,
            "cpus_allowed": format_cpulist(process.cpus_allowed) if process.cpus_allowed else None,
            "cores": format_cpulist(self.job.cores),
            "cores_source": self.job.cores_source,
            "last_cpus": format_cpulist(process.last_cpus),
            "threads": len(process.threads),
            "memory_mib_by_node": {str(n): kib // 1024 for n, kib in sorted(process.memory_kib.items())},
            "env": dict(sorted(process.env.items())),
            "unreadable": list(process.unreadable),
            "placement_known": self.placement_known,
            "nic_pairing": self.nic_status,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass(frozen=True, slots=True)
class DoctorReport:
    root: str
    topology: Topology
    processes: tuple[ProcessReport, ...]
    job_findings: tuple[Finding, ...]
    host_findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()

    @property
    def findings(self) -> list[Finding]:
        return [f for p in self.processes for f in p.findings] + list(self.job_findings) + list(self.host_findings)

    def counts(self) -> dict[str, int]:
        return {severity: sum(1 for f in self.findings if f.severity == severity) for severity in SEVERITIES}

    @property
    def healthy(self) -> bool:
        """No error or warning (info findings are advice, not faults)."""
        counts = self.counts()
        return counts["error"] == 0 and counts["warning"] == 0

    @property
    def unchecked_processes(self) -> int:
        """GPU processes whose placement or NICs could not be read: no finding says nothing of them."""
        return sum(1 for process in self.processes if not process.fully_checked)


@dataclass(frozen=True, slots=True)
class DoctorInputs:
    """Everything the rules need besides the processes, as plain values."""

    leases: tuple[Lease, ...] = ()
    leases_known: bool = False
    irqs: tuple[IrqLine, ...] = ()
    rates_known: bool = False
    minor_map: dict[int, str] = field(default_factory=dict)  # /dev/nvidiaN minor -> PCI address
    settings: DoctorSettings = field(default_factory=DoctorSettings)
    notes: tuple[str, ...] = ()
    daemon: DaemonSetup | None = None  # the daemon serving the root, when one answered


def resolve_gpus(process: ProcessFacts, topology: Topology, minor_map: dict[int, str],
                 lease: Lease | None) -> tuple[tuple[int, ...], str]:
    """The GPUs a process uses, best evidence first: open handles, NVML, its environment, its lease."""
    if process.gpu_minors:
        by_address = {gpu.address: gpu.index for gpu in topology.gpus}
        by_file = {gpu.device_file: gpu.index for gpu in topology.gpus}
        found = set()
        for minor in process.gpu_minors:
            address = minor_map.get(minor)
            index = by_address.get(address) if address else by_file.get(f"/dev/nvidia{minor}")
            if index is not None:
                found.add(index)
        if found:
            return tuple(sorted(found)), "fd"
    if process.nvml_gpus:
        return tuple(process.nvml_gpus), "nvml"
    from_env = rocm_visible(process.env, topology)  # None: no AMD GPU, or ROCm's variables unset
    if from_env is None:
        from_env = gpus_from_env(process.env.get("CUDA_VISIBLE_DEVICES"), topology)
    if from_env:
        return from_env, "env"
    if lease and lease.gpus:
        return lease.gpus, "lease"
    return (), "none"


def gpus_from_env(value: str | None, topology: Topology) -> tuple[int, ...]:
    """CUDA_VISIBLE_DEVICES (indices or GPU-UUIDs, possibly abbreviated) -> GPU indices.

    CUDA stops at the first entry it cannot parse; so does this."""
    if not value:
        return ()
    found: list[int] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.isdigit() and topology.gpu(int(entry)):
            found.append(int(entry))
        elif entry.startswith("GPU-"):
            match = [g.index for g in topology.gpus if g.uuid and g.uuid.startswith(entry)]
            if len(match) != 1:
                break
            found.append(match[0])
        else:
            break
    return tuple(sorted(set(found)))


def resolve_job(process: ProcessFacts, topology: Topology, inputs: DoctorInputs) -> Job:
    lease = next((lease for lease in inputs.leases if process.pid in lease.pids), None)
    gpus, source = resolve_gpus(process, topology, inputs.minor_map, lease)
    online = set(topology.online_cpus)
    allowed = set(process.cpus_allowed or ())
    if lease and lease.cpus:
        cores, cores_source = lease.cpus, "lease"
    elif allowed and allowed & online and not online <= allowed:
        cores, cores_source = tuple(sorted(allowed & online)), "affinity"
    else:
        cores, cores_source = process.last_cpus, "last-run"
    return Job(process, gpus, source, lease, cores, cores_source)


def build_report(root: str, topology: Topology, processes: list[ProcessFacts], inputs: DoctorInputs,
                 others: list[ProcessFacts] = ()) -> DoctorReport:
    """Report on `processes`; `others` (the rest of the host's GPU processes) only say which
    GPUs and cores are taken."""
    jobs = tuple(resolve_job(p, topology, inputs) for p in processes)
    reported = {p.pid for p in processes}
    context = jobs + tuple(resolve_job(p, topology, inputs) for p in others if p.pid not in reported)
    ctx = HostContext(topology, inputs.leases, inputs.leases_known, inputs.irqs, inputs.rates_known, context,
                      inputs.settings, inputs.daemon)
    model = DistanceModel(topology)
    reports = []
    for job in jobs:
        nic_status, nic_findings = check_nics(job, ctx, model)
        reports.append(ProcessReport(job, tuple(f for rule in PROCESS_RULES for f in rule(job, ctx)) + tuple(nic_findings),
                                     nic_status))
    job_findings: list[Finding] = []
    seen_leases: set[str] = set()
    for job in jobs:
        if job.lease is not None:
            if job.lease.id in seen_leases:
                continue
            seen_leases.add(job.lease.id)
            job_findings += gpus_spread(job.lease.gpus, f"lease {job.lease.id} ({job.lease.owner})",
                                        job.process.command, ctx, lease=job.lease)
        else:
            job_findings += gpus_spread(job.gpus, f"pid {job.process.pid} ({job.process.name or '?'})",
                                        job.process.command, ctx, pid=job.process.pid)
    notes = list(inputs.notes)
    if not jobs:
        notes.append("no process holds a GPU open (/proc/*/fd -> /dev/nvidiaN)")
    host_findings = irqs_on_isolated(ctx) + irqs_on_leased_cpus(ctx) + daemon_not_keeping_leases(ctx)
    return DoctorReport(root, topology, tuple(reports), tuple(job_findings), tuple(host_findings), tuple(notes))


# ---------------------------------------------------------------- output


def report_to_json(report: DoctorReport) -> dict[str, object]:
    return {
        "schema_version": SCHEMA_VERSION,
        "root": report.root,
        "healthy": report.healthy,
        "counts": report.counts(),
        "unchecked_processes": report.unchecked_processes,
        "notes": list(report.notes),
        "processes": [p.to_json(report.topology) for p in report.processes],
        "job_findings": [f.to_json() for f in report.job_findings],
        "host_findings": [f.to_json() for f in report.host_findings],
    }


def render_text(report: DoctorReport, *, verbose: bool = False) -> str:
    topology = report.topology
    lines = [f"doctor: host {report.root}: {len(topology.numa_nodes)} NUMA node(s), {len(topology.gpus)} GPU(s); "
             f"{len(report.processes)} process(es) using GPUs"]
    lines += [f"note: {note}" for note in report.notes]
    for process in report.processes:
        lines.append("")
        lines.append(_process_header(process, topology))
        if not process.findings and process.placement_known:
            nics = "; NCCL/UCX pinned to no far NIC" if process.nic_status == "ok" else ""
            lines.append(f"  ok: threads and memory on its GPU's NUMA node; no device IRQs on its cores{nics}")
        elif not process.findings:
            unreadable = ", ".join(process.job.process.unreadable) or "none"
            lines.append("  not checked: none of its threads' CPUs, allowed CPUs or memory could be read "
                         f"(unreadable: {unreadable}); doctor does not guess")
        if process.nic_status == NOT_CHECKED:
            lines.append(f"  not checked: which RDMA NICs it sends through (/proc/{process.job.process.pid}/environ "
                         "could not be read: not its owner or root, gone, or over the size cap); doctor does not guess")
        lines += [line for finding in process.findings for line in _finding_lines(finding, verbose)]
    for title, findings in (("jobs", report.job_findings), ("host", report.host_findings)):
        if findings:
            lines.append("")
            lines.append(f"{title}:")
            lines += [line for finding in findings for line in _finding_lines(finding, verbose)]
    counts = report.counts()
    unchecked = report.unchecked_processes
    verdict = (" — healthy" if report.healthy and not unchecked
               else f" — {unchecked} process(es) not checked" if report.healthy else "")
    lines.append("")
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info{verdict}")
    return "\n".join(lines) + "\n"


def _process_header(process: ProcessReport, topology: Topology) -> str:
    job = process.job
    gpus = ", ".join(f"GPU{i} (node {g.numa_node if (g := topology.gpu(i)) else '?'})" for i in job.gpus) or "no GPU"
    lease = f", lease {job.lease.id} ({job.lease.owner})" if job.lease else ""
    command = job.process.command
    command = command if len(command) <= 70 else command[:69] + "…"
    return (f"pid {job.process.pid} {command}\n  uses {gpus} [{job.gpu_source}]{lease}; cores "
            f"{format_cpulist(job.cores) or '?'} [{job.cores_source}]; {len(job.process.threads)} thread(s)")


def _finding_lines(finding: Finding, verbose: bool) -> list[str]:
    files = list(finding.files_read)
    if not verbose and len(files) > 4:
        files = files[:4] + [f"… {len(finding.files_read) - 4} more (--json lists all)"]
    return [f"  {finding.severity.upper():7} {finding.code}: {finding.message}",
            f"          fix:  {finding.fix}",
            f"          read: {', '.join(files)}"]
