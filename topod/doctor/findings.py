"""Doctor's rules: pure functions from (Topology, a resolved job, host context) to findings.

A finding says what is wrong, shows the values that prove it, names every file those
values came from, and gives a command that fixes it. Nothing here does I/O.
"""

from __future__ import annotations

from itertools import combinations
from math import comb

from topod.cpulist import format_cpulist
from topod.distance import DistanceModel
from topod.doctor.context import (
    HEALTH,
    ISOLATED,
    NODE_CPULIST,
    SEVERITIES,
    SIBLINGS,
    DoctorInputError,
    DoctorSettings,
    Finding,
    HostContext,
    IrqLine,
    Job,
    Lease,
    lease_from_dict,
)

__all__ = ["PROCESS_RULES", "SEVERITIES", "DoctorInputError", "DoctorSettings", "Finding", "HostContext", "IrqLine",
           "Job", "Lease", "daemon_not_keeping_leases", "gpus_spread", "irqs_on_isolated", "irqs_on_leased_cpus",
           "lease_from_dict"]

MAX_COMBINATIONS = 5000  # above this, the tightest free GPU set is chosen greedily


def _proc(job: Job, *suffixes: str) -> list[str]:
    base = f"/proc/{job.process.pid}/"
    wanted = [base + s for s in suffixes]
    out = []
    for want in wanted:
        if want.endswith("*/stat"):
            if any(p.startswith(base + "task/") for p in job.process.files_read):
                out.append(want)
        elif want in job.process.files_read:
            out.append(want)
    return out


def _short(command: str, limit: int = 60) -> str:
    return command if len(command) <= limit else command[: limit - 1] + "…"


def _who(job: Job) -> str:
    return f"pid {job.process.pid} ({job.process.name or '?'})"


# ---------------------------------------------------------------- per-process rules


def gpu_remote_cpu(job: Job, ctx: HostContext) -> list[Finding]:
    """The GPU is on node A but the process's threads run on node B."""
    gpu_nodes = ctx.gpu_nodes(job.gpus)
    placed = [t for t in job.process.threads if t.processor is not None]
    if not gpu_nodes or not placed:
        return []
    remote = [t for t in placed if ctx.node_of(t.processor) not in gpu_nodes]
    main_remote = any(t.tid == job.process.pid for t in remote)
    share = len(remote) / len(placed)
    if not remote or (share < ctx.settings.remote_thread_share and not main_remote):
        return []
    where = format_cpulist([t.processor for t in remote if t.processor is not None])
    nodes = ",".join(map(str, gpu_nodes))
    cpus = format_cpulist(ctx.good_cpus(job, gpu_nodes))
    return [Finding(
        "error" if main_remote or share > 0.5 else "warning", "gpu_remote_cpu",
        f"{_who(job)} drives GPU {_gpus(job)} on NUMA node {nodes}, but {len(remote)} of {len(placed)} threads"
        f"{' (the main thread among them)' if main_remote else ''} last ran on NUMA node "
        f"{','.join(map(str, ctx.nodes_of([t.processor for t in remote if t.processor is not None])))} "
        f"(CPUs {where}): every kernel launch and copy crosses the socket link",
        {"gpus": list(job.gpus), "gpu_numa_nodes": gpu_nodes, "remote_threads": [t.tid for t in remote],
         "remote_cpus": where, "threads": len(placed), "main_thread_remote": main_remote},
        f"taskset -a -pc {cpus} {job.process.pid}   # now, all threads; or relaunch: "
        f"numactl --cpunodebind={nodes} --membind={nodes} -- {_short(job.process.command)}",
        tuple(_proc(job, "fd/*", "task/*/stat") + ctx.gpu_files(job.gpus)
              + [NODE_CPULIST.format(node=n) for n in gpu_nodes]),
        job.process.pid)]


def memory_remote(job: Job, ctx: HostContext) -> list[Finding]:
    """The GPU is on node A but the process's memory sits on node B."""
    gpu_nodes = ctx.gpu_nodes(job.gpus)
    memory = job.process.memory_kib
    total = sum(memory.values())
    if not gpu_nodes or total == 0:
        return []
    remote_nodes = sorted(n for n, kib in memory.items() if n not in gpu_nodes and kib > 0)
    remote_kib = sum(memory[n] for n in remote_nodes)
    share = remote_kib / total
    if share < ctx.settings.remote_memory_share or remote_kib < ctx.settings.remote_memory_min_mib * 1024:
        return []
    nodes = ",".join(map(str, gpu_nodes))
    bound = job.process.mems_allowed
    bound_note = ""
    if bound and not set(bound) & set(gpu_nodes):
        bound_note = f"; Mems_allowed {format_cpulist(bound)} forbids the GPU's node outright"
    return [Finding(
        "error" if share > 0.5 else "warning", "memory_remote",
        f"{_who(job)} uses GPU {_gpus(job)} on NUMA node {nodes}, but {remote_kib // 1024} MiB of "
        f"{total // 1024} MiB resident ({share:.0%}) is on node {','.join(map(str, remote_nodes))}: host-to-device "
        f"copies from it cross the socket link{bound_note}",
        {"gpus": list(job.gpus), "gpu_numa_nodes": gpu_nodes,
         "memory_mib_by_node": {str(n): kib // 1024 for n, kib in sorted(memory.items())},
         "remote_share": round(share, 3), "mems_allowed": format_cpulist(bound) if bound else None},
        f"migratepages {job.process.pid} {','.join(map(str, remote_nodes))} {nodes}   # now (numactl package); "
        f"relaunch: numactl --membind={nodes} --cpunodebind={nodes} -- {_short(job.process.command)}",
        tuple(_proc(job, "fd/*", "numa_maps", "status") + ctx.gpu_files(job.gpus)),
        job.process.pid)]


def threads_free_to_migrate(job: Job, ctx: HostContext) -> list[Finding]:
    """Cpus_allowed spans NUMA nodes: the scheduler may move any thread across sockets."""
    allowed = job.process.cpus_allowed
    if not allowed:
        return []
    allowed_nodes = ctx.nodes_of(allowed)
    if len(allowed_nodes) < 2:
        return []
    gpu_nodes = ctx.gpu_nodes(job.gpus)
    target = gpu_nodes or allowed_nodes[:1]
    sockets = sorted({cpu.package for c in allowed if (cpu := ctx.topology.cpu(c)) and cpu.package is not None})
    own_span = bool(gpu_nodes) and set(allowed_nodes) <= set(gpu_nodes)
    cpus = format_cpulist(ctx.good_cpus(job, target))
    return [Finding(
        "info" if own_span else "warning", "threads_free_to_migrate",
        f"{_who(job)} may run on CPUs {format_cpulist(allowed)}, which span NUMA nodes "
        f"{','.join(map(str, allowed_nodes))} (sockets {','.join(map(str, sockets)) or '?'}): the scheduler can move "
        f"any of its threads away from GPU {_gpus(job)}"
        + (" (its GPUs span those nodes too; pin each thread near the GPU it drives)" if own_span else ""),
        {"cpus_allowed": format_cpulist(allowed), "numa_nodes": allowed_nodes, "sockets": sockets,
         "gpu_numa_nodes": gpu_nodes},
        f"taskset -a -pc {cpus} {job.process.pid}   # now; relaunch: taskset -c {cpus} "
        f"{_short(job.process.command)}",
        tuple(_proc(job, "status") + [NODE_CPULIST.format(node=n) for n in allowed_nodes]),
        job.process.pid)]


def irqs_on_cores(job: Job, ctx: HostContext) -> list[Finding]:
    """RDMA/NVMe interrupts delivered to the CPUs the process computes on."""
    cores = set(job.cores)
    by_device: dict[str, list[IrqLine]] = {}
    for line in ctx.irqs:
        if line.kind in ("rdma", "nvme") and cores & set(line.cpus):
            by_device.setdefault(line.device, []).append(line)
    findings = []
    leased = {c for lease in ctx.leases for c in lease.cpus}
    for address, lines in sorted(by_device.items()):
        hit = sorted({c for line in lines for c in line.cpus} & cores)
        rate = sum(line.rate.get(c, 0.0) for line in lines for c in hit if line.rate) if ctx.rates_known else None
        if rate is None:
            severity, how = "warning", "rates not sampled, judged by affinity only (--irq-interval 2 measures them)"
        elif rate == 0:
            severity, how = "info", "idle during the sample, but any burst lands there"
        else:
            severity = "error" if rate >= ctx.settings.irq_busy_per_s else "warning"
            how = f"{rate:.0f} interrupts/s on those cores during the sample"
        device = ctx.topology.device(address)
        node = device.numa_node if device else None
        planned = sorted({c for line in lines if line.planned for c in line.planned})
        if planned:
            target, origin = planned, "topod's IRQ plan"
        else:
            node_cpus = list(ctx.topology.node(node).cpus) if node is not None and ctx.topology.node(node) else []
            isolated = set(ctx.topology.isolated_cpus)
            target = [c for c in node_cpus if c not in cores and c not in leased and c not in isolated]
            target = target or [c for c in node_cpus if c not in cores]
            origin = f"free CPUs of node {node}"
        irq_list = " ".join(str(line.irq) for line in lines)
        own = format_cpulist(sorted(cores))
        fix = (f"for irq in {irq_list}; do echo {format_cpulist(target) or '<cpus>'} > "
               f"/proc/irq/$irq/smp_affinity_list; done   # {origin}; keep irqbalance off the job's cores "
               f"(IRQBALANCE_BANNED_CPULIST={own})")
        if lines[0].kind == "nvme":
            fix += f"; if the write fails with EIO the vectors are kernel-managed: boot with isolcpus=managed_irq,{own}"
        files = [line.source for line in lines] + [f"/sys/bus/pci/devices/{address}/msi_irqs"]
        if ctx.rates_known:
            files.append("/proc/interrupts")
        findings.append(Finding(
            severity, "irq_on_cores",
            f"{len(lines)} IRQ(s) of {lines[0].name} ({lines[0].kind}, {address}) are delivered to CPU(s) "
            f"{format_cpulist(hit)}, which {_who(job)} computes on ({job.cores_source}: {format_cpulist(job.cores)}); "
            f"{how}",
            {"device": address, "kind": lines[0].kind, "irqs": [line.irq for line in lines],
             "cpus": format_cpulist(hit), "cores": format_cpulist(job.cores), "cores_source": job.cores_source,
             "rate_per_s": None if rate is None else round(rate, 1), "target_cpus": format_cpulist(target)},
            fix, tuple(files), job.process.pid))
    return findings


def ht_siblings_split(job: Job, ctx: HostContext) -> list[Finding]:
    """A physical core whose hyper-threads belong to two different jobs."""
    if not job.pinned:
        return []
    owners = _core_owners(job, ctx)
    pairs: list[tuple[int, int, str]] = []
    for cpu_id in job.cores:
        cpu = ctx.topology.cpu(cpu_id)
        for sibling in (cpu.siblings if cpu else ()):
            if sibling != cpu_id and sibling not in job.cores and sibling in owners:
                pairs.append((cpu_id, sibling, owners[sibling]))
    if not pairs:
        return []
    split = sorted({a for a, _, _ in pairs})
    keep = [c for c in job.cores if c not in split]
    others = sorted({who for _, _, who in pairs})
    shown = ", ".join(f"{a}/{b}" for a, b, _ in pairs[:6]) + (" …" if len(pairs) > 6 else "")
    fix = (f"taskset -a -pc {format_cpulist(keep)} {job.process.pid}   # drops the shared cores"
           if keep else "move one of the jobs to other cores")
    fix += f"; topod leases hand out whole cores: topoctl run --gpus {max(1, len(job.gpus))} --level good -- …"
    return [Finding(
        "warning", "ht_siblings_split",
        f"{_who(job)} shares {len(pairs)} physical core(s) with {', '.join(others)}: hyper-thread pairs {shown} "
        f"are split between the jobs, so each steals the other's execution units and L1/L2",
        {"pairs": [[a, b] for a, b, _ in pairs], "other_jobs": others, "cores": format_cpulist(job.cores),
         "cores_source": job.cores_source},
        fix, tuple(_proc(job, "status") + [SIBLINGS.format(cpu=a) for a in split]), job.process.pid)]


def _core_owners(job: Job, ctx: HostContext) -> dict[int, str]:
    """CPU -> a name for the other job pinned there (leases first, then pinned processes)."""
    owners: dict[int, str] = {}
    for other in ctx.jobs:
        if other.process.pid != job.process.pid and other.pinned and (job.lease is None or other.lease != job.lease):
            for cpu in other.cores:
                owners.setdefault(cpu, f"pid {other.process.pid}")
    for lease in ctx.leases:
        if lease != job.lease:
            for cpu in lease.cpus:
                owners[cpu] = f"lease {lease.id} ({lease.owner})"
    return owners


def isolated_cpus_misused(job: Job, ctx: HostContext) -> list[Finding]:
    """Allowed on isolated CPUs that are not its lease's, or piling threads on one isolated CPU."""
    isolated = set(ctx.topology.isolated_cpus)
    allowed = set(job.process.cpus_allowed or ())
    on_isolated = sorted(allowed & isolated)
    if not on_isolated:
        return []
    findings = []
    own = set(job.lease.cpus) if job.lease else set()
    foreign = [c for c in on_isolated if c not in own]
    files = tuple(_proc(job, "status") + [ISOLATED])
    if foreign:
        holders = sorted({f"lease {lease.id} ({lease.owner})" for lease in ctx.leases if lease != job.lease
                          and set(lease.cpus) & set(foreign)})
        if holders:
            severity, why = "error", f"they are reserved to {', '.join(holders)}"
        elif ctx.leases_known:
            severity, why = "warning", "no lease holds them: isolated CPUs are handed out by leases only"
        else:
            severity, why = "info", "no lease data (no daemon), so doctor cannot tell whether they were reserved for it"
        housekeeping = sorted(allowed - isolated)
        target = format_cpulist(sorted(own) or housekeeping or ctx.good_cpus(job, ctx.gpu_nodes(job.gpus)))
        findings.append(Finding(
            severity, "isolated_cpus_misused",
            f"{_who(job)} may run on isolated CPU(s) {format_cpulist(foreign)}: {why}",
            {"isolated_cpus": format_cpulist(sorted(isolated)), "allowed_isolated": format_cpulist(foreign),
             "lease": job.lease.id if job.lease else None, "holders": holders},
            f"taskset -a -pc {target} {job.process.pid}", files, job.process.pid))
    stacked: dict[int, list[int]] = {}
    for thread in job.process.threads:
        if thread.processor in isolated:
            stacked.setdefault(thread.processor, []).append(thread.tid)
    piles = {cpu: tids for cpu, tids in stacked.items() if len(tids) > 1}
    idle = [c for c in on_isolated if c not in stacked]
    if piles and idle:
        tids = [tid for cpu in sorted(piles) for tid in piles[cpu]]
        moves = "; ".join(f"taskset -pc {cpu} {tid}" for tid, cpu in zip(tids[1:], idle))
        worst = max(piles, key=lambda c: len(piles[c]))
        findings.append(Finding(
            "warning", "isolated_cpus_misused",
            f"{_who(job)} has {len(piles[worst])} threads on isolated CPU {worst} while isolated CPU(s) "
            f"{format_cpulist(idle)} it may use stay idle: the scheduler does not balance load onto isolated CPUs",
            {"threads_by_cpu": {str(c): t for c, t in sorted(piles.items())}, "idle_isolated": format_cpulist(idle)},
            f"{moves}   # one thread per isolated CPU; or keep its helper threads on housekeeping CPUs",
            tuple(_proc(job, "status", "task/*/stat") + [ISOLATED]), job.process.pid))
    return findings


def gpus_outside_lease(job: Job, ctx: HostContext) -> list[Finding]:
    """A process in a lease uses GPUs the lease does not hold (its own CUDA/HIP/ROCR
    variables, or the device files it opened, say so): another job's GPUs."""
    if job.lease is None or not job.lease.gpus or job.gpu_source not in ("fd", "nvml", "env"):
        return []
    outside = sorted(set(job.gpus) - set(job.lease.gpus))
    if not outside:
        return []
    names = [name for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
             if name in job.process.env]
    shown = " ".join(f"{name}={job.process.env[name]}" for name in names)
    return [Finding(
        "error", "gpus_outside_lease",
        f"{_who(job)} in lease {job.lease.id} (GPUs {','.join(map(str, job.lease.gpus))}) uses GPU(s) "
        f"{','.join(map(str, outside))} it does not hold (from {job.gpu_source}{': ' + shown if shown else ''})",
        {"gpus": list(job.gpus), "lease_gpus": list(job.lease.gpus), "outside": outside, "source": job.gpu_source,
         "environment": {name: job.process.env[name] for name in names}},
        f"{_lease_visibility(job.lease.gpus, ctx)} {_short(job.process.command or job.process.name or '<command>')}"
        "   # the lease's own GPUs, nothing else set (topoctl run sets this for you)",
        tuple(_proc(job, "environ", "fd")), job.process.pid, job.lease.id)]


def _lease_visibility(gpus: tuple[int, ...], ctx: HostContext) -> str:
    """The variables that show a job exactly these GPUs: ROCR_VISIBLE_DEVICES by ROCr's
    GPU-<unique_id> for AMD GPUs (with HIP's and CUDA's own lists unset), else
    CUDA_VISIBLE_DEVICES."""
    chosen = [ctx.topology.gpu(g) for g in gpus]
    if chosen and all(g is not None and g.amd is not None and g.uuid for g in chosen):
        return (f"env -u HIP_VISIBLE_DEVICES -u CUDA_VISIBLE_DEVICES ROCR_VISIBLE_DEVICES="
                f"{','.join(g.uuid for g in chosen)}")
    return f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}"


PROCESS_RULES = (gpu_remote_cpu, memory_remote, threads_free_to_migrate, irqs_on_cores, ht_siblings_split,
                 isolated_cpus_misused, gpus_outside_lease)


def _gpus(job: Job) -> str:
    return ",".join(map(str, job.gpus)) or "?"


# ---------------------------------------------------------------- job- and host-level rules


def gpus_spread(gpus: tuple[int, ...], who: str, command: str, ctx: HostContext, *, pid: int | None = None,
                lease: Lease | None = None) -> list[Finding]:
    """A job's GPUs span NUMA nodes while a set of the same size on fewer nodes is free."""
    if len(gpus) < 2:
        return []
    nodes = ctx.gpu_nodes(gpus)
    if len(nodes) < 2:
        return []
    used = {g for job in ctx.jobs if job.process.pid != pid and (lease is None or job.lease != lease) for g in job.gpus}
    used |= {g for other in ctx.leases if other != lease for g in other.gpus}
    candidates = sorted({g.index for g in ctx.topology.gpus if g.index not in used} | set(gpus))
    model = DistanceModel(ctx.topology)
    best = tightest_set(candidates, len(gpus), ctx, model)
    if best is None or len(ctx.gpu_nodes(best)) >= len(nodes):
        return []
    own_cost, best_cost = set_cost(gpus, model), set_cost(best, model)
    levels = sorted({model.gpus(a, b).label for a, b in combinations(gpus, 2)})
    listed = ",".join(map(str, best))
    fix = (f"topoctl run --gpus {len(gpus)} --level good -- {_short(command)}   # or: "
           f"CUDA_VISIBLE_DEVICES={listed} {_short(command, 40)}")
    if lease:
        fix = f"release lease {lease.id}, then: " + fix
    files = ctx.gpu_files(tuple(sorted(set(gpus) | set(best))))
    return [Finding(
        "warning", "gpus_spread",
        f"{who} uses GPUs {','.join(map(str, gpus))} across NUMA nodes {','.join(map(str, nodes))} (links "
        f"{'/'.join(levels)}, cost {own_cost:.1f}), while GPUs {listed} on node "
        f"{','.join(map(str, ctx.gpu_nodes(best)))} are free (cost {best_cost:.1f}): host memory, CPU threads and "
        f"copies for part of the job cross the socket link",
        {"gpus": list(gpus), "numa_nodes": nodes, "cost": round(own_cost, 2), "free_gpus": candidates,
         "tighter_set": list(best), "tighter_numa_nodes": ctx.gpu_nodes(best), "tighter_cost": round(best_cost, 2)},
        fix, tuple(files), pid, lease.id if lease else None)]


def set_cost(gpus: tuple[int, ...] | list[int], model: DistanceModel) -> float:
    """The seed's topology cost: the sum of pairwise weighted distances."""
    return sum(model.gpus(a, b).weight for a, b in combinations(gpus, 2))


def tightest_set(candidates: list[int], size: int, ctx: HostContext, model: DistanceModel) -> tuple[int, ...] | None:
    """The candidate set of `size` GPUs on the fewest NUMA nodes, then the lowest cost."""
    if len(candidates) < size:
        return None
    if comb(len(candidates), size) <= MAX_COMBINATIONS:
        return min(combinations(candidates, size),
                   key=lambda s: (len(ctx.gpu_nodes(s)), set_cost(s, model), s))
    # Greedy: fill from the nodes with the most candidates first.
    by_node: dict[int, list[int]] = {}
    for gpu in candidates:
        node = ctx.gpu_nodes((gpu,))
        by_node.setdefault(node[0] if node else -1, []).append(gpu)
    chosen: list[int] = []
    for _, members in sorted(by_node.items(), key=lambda item: (-len(item[1]), item[0])):
        chosen.extend(members[: size - len(chosen)])
        if len(chosen) == size:
            break
    return tuple(sorted(chosen))


def irqs_on_isolated(ctx: HostContext) -> list[Finding]:
    """Housekeeping work on isolated CPUs: device interrupts delivered there."""
    isolated = set(ctx.topology.isolated_cpus)
    if not isolated:
        return []
    lines = [line for line in ctx.irqs if set(line.cpus) & isolated]
    if not lines:
        return []
    housekeeping = [c for c in ctx.topology.online_cpus if c not in isolated]
    hit = sorted({c for line in lines for c in line.cpus} & isolated)
    names = sorted({line.name for line in lines})
    return [Finding(
        "warning", "isolated_cpus_misused",
        f"{len(lines)} device IRQ(s) ({', '.join(names[:6])}{' …' if len(names) > 6 else ''}) are delivered to "
        f"isolated CPU(s) {format_cpulist(hit)}: isolated CPUs are for the jobs leased to them, not for housekeeping",
        {"irqs": [line.irq for line in lines], "isolated_cpus": format_cpulist(sorted(isolated)),
         "hit": format_cpulist(hit)},
        f"for irq in {' '.join(str(line.irq) for line in lines)}; do echo {format_cpulist(housekeeping)} > "
        f"/proc/irq/$irq/smp_affinity_list; done   # housekeeping CPUs",
        tuple([ISOLATED] + [line.source for line in lines]))]


def irqs_on_leased_cpus(ctx: HostContext) -> list[Finding]:
    """RDMA/NVMe interrupts delivered to a lease's CPUs, for leases whose processes were
    not checked one by one (irq_on_cores says it for those): a lease taken and not yet
    run on, or run by processes doctor cannot see."""
    covered = {job.lease.id for job in ctx.jobs if job.lease is not None}
    findings = []
    for lease in ctx.leases:
        if lease.id in covered or not lease.cpus:
            continue
        cpus = set(lease.cpus)
        lines = [line for line in ctx.irqs if line.kind in ("rdma", "nvme") and cpus & set(line.cpus)]
        if not lines:
            continue
        hit = sorted({c for line in lines for c in line.cpus} & cpus)
        names = sorted({line.name for line in lines})
        free = [c for c in ctx.topology.online_cpus
                if not any(c in other.cpus for other in ctx.leases) and c not in set(ctx.topology.isolated_cpus)]
        findings.append(Finding(
            "warning", "irqs_on_leased_cpus",
            f"{len(lines)} device IRQ(s) ({', '.join(names[:6])}{' …' if len(names) > 6 else ''}) are delivered to "
            f"CPU(s) {format_cpulist(hit)} of lease {lease.id} ({lease.owner}): its job will share them with "
            "interrupt handling",
            {"lease": lease.id, "irqs": [line.irq for line in lines], "lease_cpus": format_cpulist(lease.cpus),
             "hit": format_cpulist(hit)},
            _irq_mode_fix(ctx) or (f"for irq in {' '.join(str(line.irq) for line in lines)}; do echo "
                                   f"{format_cpulist(free) or '<cpus>'} > /proc/irq/$irq/smp_affinity_list; done"),
            tuple(line.source for line in lines), lease=lease.id))
    return findings


def _irq_mode_fix(ctx: HostContext) -> str | None:
    if ctx.daemon is None or ctx.daemon.irq_mode == "on":
        return None
    return ('set [irq] mode = "on" in /etc/topod/topod.toml, then systemctl reload topod: topod keeps device '
            "IRQs off leased CPUs")


def daemon_not_keeping_leases(ctx: HostContext) -> list[Finding]:
    """Leases are held while the daemon serving this root does not keep device IRQs off
    them (IRQ mode off or dry-run), or leaves the host's own threads free to run there
    (isolation off: advice, as it is a choice)."""
    if ctx.daemon is None or not ctx.leases:
        return []
    leased = sorted({c for lease in ctx.leases for c in lease.cpus})
    findings = []
    if ctx.daemon.irq_mode != "on":
        doing = ("only plans IRQ placement, writing nothing" if ctx.daemon.irq_mode == "dry-run"
                 else "balances no IRQs")
        findings.append(Finding(
            "warning", "irq_balancing_off",
            f"{len(ctx.leases)} lease(s) held while topod {doing} ([irq] mode = \"{ctx.daemon.irq_mode}\"): device "
            f"IRQs are not kept off the leased CPUs ({format_cpulist(leased) or 'none'})",
            {"irq_mode": ctx.daemon.irq_mode, "leases": len(ctx.leases), "leased_cpus": format_cpulist(leased)},
            _irq_mode_fix(ctx) or "", (HEALTH,)))
    if not ctx.daemon.isolation:
        findings.append(Finding(
            "info", "isolation_off",
            f"{len(ctx.leases)} lease(s) held and [isolate] system is off: the host's own services may run on "
            f"the leased CPUs ({format_cpulist(leased) or 'none'})",
            {"isolation": False, "leases": len(ctx.leases), "leased_cpus": format_cpulist(leased)},
            "set [isolate] system = true in /etc/topod/topod.toml, then systemctl reload topod: the system "
            "slices are narrowed off leased CPUs while leases live", (HEALTH,)))
    return findings
