"""Doctor's GPU-NIC check: does a GPU process send through the RDMA NIC beside its GPU?

What a rank sends through is what its environment tells NCCL and UCX: NCCL_IB_HCA and
UCX_NET_DEVICES, read from /proc/PID/environ (only those variables are kept). Each is
parsed as its library does (pure parsers below), matched against the host's offered NIC
ports (ACTIVE ports of `rdma` functions, topod.alloc.nics.offered_nics), and each of the
process's GPUs is compared by the GPU distance levels (PIX/PXB same switch < PHB same root
complex < NODE same node < SYS other node) with the nearest offered NIC:

- nic_far (warning at NODE, error at SYS): the variable selects only NICs on another root
  complex or another node than the GPU's nearest one;
- nic_unknown (error): the variable selects no active RDMA port of this host (NCCL falls
  back to sockets, UCX to TCP or shared memory);
- nic_unpinned (info): neither variable narrows the choice while a NIC sits under the GPU's
  switch or root complex (NCCL's own detection usually finds it; a lease or topoctl bind
  makes it certain).

A process whose environ could not be read (not its owner, gone, over the cap) is "not
checked", never "ok". Pure: the facts come in as values.
"""

from __future__ import annotations

from dataclasses import dataclass

from topod.alloc.nics import Nic, offered_nics
from topod.distance import BASE_WEIGHTS, DistanceModel
from topod.doctor.context import SYS_NUMA, Finding, HostContext, Job

VARIABLES = ("NCCL_IB_HCA", "UCX_NET_DEVICES")
FAR_LEVELS = ("NODE", "SYS")  # another root complex, another node
NEAR_LEVELS = ("PIX", "PXB", "PHB")  # under the GPU's switch or root complex
PORT_STATE = "/sys/bus/pci/devices/{address}/infiniband/{name}/ports/{port}/state"

# Statuses a process's NIC check ends in (ProcessReport.nic_status).
OK, FINDING, NOT_CHECKED, NOTHING = "ok", "finding", "not_checked", "none"


@dataclass(frozen=True, slots=True)
class NicSelector:
    """Which NIC ports a variable selects. items: (name, port or None for any port)."""

    variable: str
    text: str
    items: tuple[tuple[str, int | None], ...]
    exclude: bool = False  # '^': every port but the matched ones
    exact: bool = True  # False: an item is a name prefix (NCCL without '=')
    everything: bool = False  # selects all ports: no narrowing at all

    def selects(self, name: str, port: int) -> bool:
        if self.everything:
            return True
        matched = any((name == want if self.exact else name.startswith(want)) and (wport is None or wport == port)
                      for want, wport in self.items)
        return matched != self.exclude


def _items(text: str) -> tuple[tuple[str, int | None], ...]:
    """'mlx5_0:1,mlx5_1' -> (('mlx5_0', 1), ('mlx5_1', None)); a port that is not a
    number selects nothing (-1), as NCCL's atoi-based parser ends up doing."""
    items = []
    for part in text.split(","):
        name, sep, port = part.strip().partition(":")
        if not name:
            continue
        items.append((name, (int(port) if port.isdecimal() else -1) if sep else None))
    return tuple(items)


def parse_nccl_ib_hca(text: str) -> NicSelector:
    """NCCL_IB_HCA as NCCL reads it: an optional '^' (exclude), then an optional '='
    (exact names; without it each item is a prefix, so mlx5_1 also selects mlx5_10),
    then NAME[:PORT] items. Empty (or nothing after the markers) selects every port."""
    rest = text.strip()
    exclude = rest.startswith("^")
    rest = rest[1:] if exclude else rest
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    items = _items(rest)
    if not items:  # NCCL: an empty list matches every device; '^' then excludes them all
        return NicSelector("NCCL_IB_HCA", text, (), exclude=False, exact=exact, everything=not exclude)
    return NicSelector("NCCL_IB_HCA", text, items, exclude=exclude, exact=exact)


def parse_ucx_net_devices(text: str) -> NicSelector:
    """UCX_NET_DEVICES: 'all' (the default) or exact DEVICE:PORT names (mlx5_0:1, eth0),
    with an optional leading '^' to exclude them."""
    rest = text.strip()
    exclude = rest.startswith("^")
    rest = rest[1:] if exclude else rest
    items = _items(rest)
    if not items or any(name == "all" for name, _ in items):
        return NicSelector("UCX_NET_DEVICES", text, (), everything=not exclude)
    # An RDMA device without :PORT is not a UCX device name: it selects no RDMA port.
    return NicSelector("UCX_NET_DEVICES", text, tuple((n, p if p is not None else -1) for n, p in items),
                       exclude=exclude)


PARSERS = {"NCCL_IB_HCA": parse_nccl_ib_hca, "UCX_NET_DEVICES": parse_ucx_net_devices}


def _rank(level: str) -> float:
    return BASE_WEIGHTS.get(level, BASE_WEIGHTS["SYS"])


def _hca(nics: list[Nic]) -> str:
    return ",".join(nic.hca for nic in nics)


def check_nics(job: Job, ctx: HostContext, model: DistanceModel | None = None) -> tuple[str, list[Finding]]:
    """(status, findings) for one process: status is ok, finding, not_checked (environ
    unreadable: doctor does not guess) or none (no GPU resolved or no offered NIC)."""
    nics = offered_nics(ctx.topology)
    gpus = [g for g in (ctx.topology.gpu(i) for i in job.gpus) if g is not None]
    if not nics or not gpus:
        return NOTHING, []
    environ = f"/proc/{job.process.pid}/environ"
    if environ not in job.process.files_read:
        return NOT_CHECKED, []
    model = model or DistanceModel(ctx.topology)
    levels = {gpu.index: {nic.key: model.between(gpu.address, nic.address).label for nic in nics} for gpu in gpus}
    nearest = {gpu: min(_rank(level) for level in row.values()) for gpu, row in levels.items()}
    own = {gpu: [nic for nic in nics if _rank(levels[gpu][nic.key]) == nearest[gpu]] for gpu in levels}
    wanted: list[Nic] = []
    for gpu in sorted(own):
        wanted += [nic for nic in own[gpu] if nic not in wanted]
    fix_hca, fix_ucx = "=" + _hca(wanted), _hca(wanted)
    files = [environ] + [SYS_NUMA.format(address=g.address) for g in gpus]
    command = job.process.command if len(job.process.command) <= 50 else job.process.command[:49] + "…"
    fix = (f"relaunch with NCCL_IB_HCA={fix_hca} UCX_NET_DEVICES={fix_ucx} -- {command}   # or start each rank "
           "under a topod lease with topoctl bind -- CMD (it sets the rank's own NIC)")
    who = f"pid {job.process.pid} ({job.process.name or '?'})"
    findings: list[Finding] = []
    pinned = False
    for variable in VARIABLES:
        text = job.process.env.get(variable)
        if text is None:
            continue
        selector = PARSERS[variable](text)
        if selector.everything:
            continue
        pinned = True
        chosen = [nic for nic in nics if selector.selects(nic.name, nic.port)]
        evidence: dict[str, object] = {"variable": variable, "value": text, "gpus": sorted(levels),
                                       "selected": [n.hca for n in chosen],
                                       "nearest": {str(g): [n.hca for n in own[g]] for g in sorted(own)},
                                       "nearest_level": {str(g): _label(nearest[g]) for g in sorted(nearest)}}
        if not chosen:
            findings.append(Finding(
                "error", "nic_unknown",
                f"{who} has {variable}={text}, which selects no active RDMA NIC port of this host (offered: "
                f"{_hca(list(nics))}): it cannot send over RDMA and falls back to sockets/TCP",
                evidence, fix, tuple(files), job.process.pid))
            continue
        far: dict[int, str] = {}
        for gpu in sorted(levels):
            best = min(_rank(levels[gpu][nic.key]) for nic in chosen)
            if best > nearest[gpu] and _label(best) in FAR_LEVELS:
                far[gpu] = _label(best)
        if not far:
            continue
        severity = "error" if "SYS" in far.values() else "warning"
        where = "; ".join(f"GPU {gpu}: {level}, nearest {_hca(own[gpu])} ({_label(nearest[gpu])})"
                          for gpu, level in sorted(far.items()))
        evidence["far"] = {str(g): level for g, level in sorted(far.items())}
        findings.append(Finding(
            severity, "nic_far",
            f"{who} has {variable}={text}, which selects only NICs {_where(far)} from its GPU ({where}): "
            "its RDMA traffic crosses the PCIe root complex"
            + (" and the socket link" if severity == "error" else "") + " instead of GPUDirect under its switch",
            evidence, fix,
            tuple(files + [PORT_STATE.format(address=n.address, name=n.name, port=n.port) for n in chosen]),
            job.process.pid))
    if not pinned:
        near = {gpu: _label(level) for gpu, level in nearest.items() if _label(level) in NEAR_LEVELS}
        if near:
            findings.append(Finding(
                "info", "nic_unpinned",
                f"{who} sets neither NCCL_IB_HCA nor UCX_NET_DEVICES while GPU "
                f"{','.join(map(str, sorted(near)))} has an RDMA NIC under its switch or root complex "
                f"({_hca(wanted)}): NCCL and UCX choose from every NIC of the host",
                {"gpus": sorted(levels), "nearest": {str(g): [n.hca for n in own[g]] for g in sorted(own)},
                 "nearest_level": near},
                fix, tuple(files), job.process.pid))
    return (FINDING if findings else OK), findings


def _label(weight: float) -> str:
    return next((level for level, value in BASE_WEIGHTS.items() if value == weight), "SYS")


def _where(far: dict[int, str]) -> str:
    return "on another node" if set(far.values()) == {"SYS"} else \
        "on another root complex" if set(far.values()) == {"NODE"} else "on another root complex or node"
