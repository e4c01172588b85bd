"""The values doctor's rules work on: settings, findings, leases, IRQ lines, resolved jobs
and the host context. Plain frozen data and small lookups; no I/O, no policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from topod.doctor.procs import ProcessFacts
from topod.errors import TopodError
from topod.model import Topology

SEVERITIES = ("error", "warning", "info")
SYS_NUMA = "/sys/bus/pci/devices/{address}/numa_node"
NODE_CPULIST = "/sys/devices/system/node/node{node}/cpulist"
ISOLATED = "/sys/devices/system/cpu/isolated"
SIBLINGS = "/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
HEALTH = "GET /v1/health"  # what the daemon said of itself (not a file, but where the value came from)


class DoctorInputError(TopodError):
    """Lease or IRQ-plan data handed to doctor is malformed; the message names the field."""

    code = "bad_doctor_input"


@dataclass(frozen=True, slots=True)
class DoctorSettings:
    remote_thread_share: float = 0.25  # flag when this share of threads last ran off the GPU's node
    remote_memory_share: float = 0.10  # ... or this share of resident memory sits off it
    remote_memory_min_mib: int = 64  # ... and it is at least this big
    irq_busy_per_s: float = 1000.0  # IRQ rate on a rank's cores that makes the finding an error


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str
    code: str
    message: str
    evidence: dict[str, object]
    fix: str
    files_read: tuple[str, ...]
    pid: int | None = None
    lease: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"severity": self.severity, "code": self.code, "pid": self.pid, "lease": self.lease,
                "message": self.message, "evidence": self.evidence, "fix": self.fix,
                "files_read": list(self.files_read)}


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    owner: str
    gpus: tuple[int, ...]
    cpus: tuple[int, ...]
    pids: tuple[int, ...]


def lease_from_dict(value: object) -> Lease:
    """{id, owner, gpus:[int], cpus:[int], pids:[int]} -> Lease; DoctorInputError names what is wrong."""
    if not isinstance(value, dict):
        raise DoctorInputError(f"a lease must be an object with id, owner, gpus, cpus, pids; got {value!r}")
    lease_id = value.get("id")
    if not isinstance(lease_id, str | int) or isinstance(lease_id, bool) or str(lease_id) == "":
        raise DoctorInputError(f"lease field 'id' must be a non-empty string; got {lease_id!r}")

    def ints(key: str) -> tuple[int, ...]:
        items = value.get(key, [])
        if not isinstance(items, list | tuple) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                          and i >= 0 for i in items):
            raise DoctorInputError(f"lease {lease_id}: field '{key}' must be a list of non-negative integers; "
                                   f"got {items!r}")
        return tuple(sorted(set(items)))

    return Lease(str(lease_id), str(value.get("owner") or "?"), ints("gpus"), ints("cpus"), ints("pids"))


@dataclass(frozen=True, slots=True)
class IrqLine:
    """One interrupt vector of an RDMA/NVMe/NIC device and where it lands."""

    irq: int
    device: str  # PCI address
    kind: str
    name: str  # mlx5_0, nvme1, ...
    cpus: tuple[int, ...]
    source: str  # the file the CPUs came from
    rate: dict[int, float] | None = None  # per CPU, per second, when two snapshots were taken
    planned: tuple[int, ...] | None = None  # where topod's IRQ plan puts it


@dataclass(frozen=True, slots=True)
class DaemonSetup:
    """How the daemon serving this root is set up (from GET /v1/health): whether what it
    promises a lease (device IRQs kept off its CPUs, the host's threads kept off them)
    is being done at all."""

    irq_mode: str  # on | dry-run | off
    isolation: bool  # [isolate] system: the host's own threads kept off leased CPUs


def daemon_setup_from_health(health: object) -> DaemonSetup | None:
    """The daemon's health answer -> DaemonSetup; None for an answer that lacks the fields."""
    if not isinstance(health, dict):
        return None
    irq, isolation = health.get("irq"), health.get("isolation")
    mode = irq.get("mode") if isinstance(irq, dict) else None
    if not isinstance(mode, str):
        return None
    system = isolation.get("system") if isinstance(isolation, dict) else None
    return DaemonSetup(mode, system is True)


@dataclass(frozen=True, slots=True)
class Job:
    """A process under diagnosis with its GPUs and cores resolved."""

    process: ProcessFacts
    gpus: tuple[int, ...]
    gpu_source: str  # fd | nvml | env | none
    lease: Lease | None
    cores: tuple[int, ...]
    cores_source: str  # lease | affinity | last-run

    @property
    def pinned(self) -> bool:
        return self.cores_source in ("lease", "affinity")


@dataclass(frozen=True, slots=True)
class HostContext:
    topology: Topology
    leases: tuple[Lease, ...] = ()
    leases_known: bool = False  # lease data was given (a daemon answered), even if empty
    irqs: tuple[IrqLine, ...] = ()
    rates_known: bool = False
    jobs: tuple[Job, ...] = ()  # every GPU process found, for 'free' and 'shared core' questions
    settings: DoctorSettings = field(default_factory=DoctorSettings)
    daemon: DaemonSetup | None = None  # the daemon serving this root, when one answered

    def node_of(self, cpu: int) -> int | None:
        found = self.topology.cpu(cpu)
        return found.numa_node if found else None

    def nodes_of(self, cpus: tuple[int, ...] | list[int] | set[int]) -> list[int]:
        return sorted({n for n in (self.node_of(c) for c in cpus) if n is not None})

    def gpu_nodes(self, gpus: tuple[int, ...]) -> list[int]:
        found = (self.topology.gpu(i) for i in gpus)
        return sorted({g.numa_node for g in found if g is not None and g.numa_node is not None})

    def whole_cores(self, cpus: set[int]) -> set[int]:
        """cpus and their hyper-thread siblings: a job should own whole physical cores."""
        return {s for c in cpus if (cpu := self.topology.cpu(c)) for s in cpu.physical_core} | cpus

    def gpu_files(self, gpus: tuple[int, ...]) -> list[str]:
        return [SYS_NUMA.format(address=g.address) for g in (self.topology.gpu(i) for i in gpus) if g]

    def good_cpus(self, job: Job, nodes: list[int]) -> list[int]:
        """Where a job should run: its lease's CPUs on those nodes, else the nodes' CPUs that
        no other lease or pinned job holds, that are not isolated and take no device IRQs.
        Each exclusion is dropped again (last first) if it would leave nothing."""
        if job.lease and job.lease.cpus:
            return [c for c in job.lease.cpus if self.node_of(c) in nodes] or list(job.lease.cpus)
        taken = {c for lease in self.leases if lease != job.lease for c in lease.cpus}
        taken |= {c for other in self.jobs if other.process.pid != job.process.pid and other.pinned
                  for c in other.cores}
        exclusions = [taken, set(self.topology.isolated_cpus), {c for line in self.irqs for c in line.cpus}]
        cpus = [c for n in nodes if (node := self.topology.node(n)) for c in node.cpus]
        for keep in range(len(exclusions), -1, -1):
            banned = self.whole_cores(set().union(*exclusions[:keep]))
            left = [c for c in cpus if c not in banned]
            if left:
                return left
        return cpus
