"""What this host can enforce about a lease, found once at start from the host tree.

Three modes, strongest first:
- ``cgroup``: the unified (v2) hierarchy is mounted at /sys/fs/cgroup, it offers the
  cpuset controller, and systemd runs (it owns the tree and delegates cpusets to units:
  AllowedCPUs=, AllowedMemoryNodes=).
- ``affinity``: the CPUs can only be held with sched_setaffinity (cgroup v1 or hybrid
  hosts, where cpuset sits on a v1 hierarchy and systemd's AllowedCPUs= has no effect,
  or no systemd); a job may undo it.
- ``none``: nothing: the root is not the host topod runs on (a captured tree: its CPUs
  are not this machine's), or this platform has no sched_setaffinity.

`host_enforcement` says what the host *can* do; `lease_enforcement` says what a lease
*gets*, which is never more than what topod carries out. topod starts no per-lease
scopes, so a lease on a cgroup host still gets ``affinity`` (topoctl run / bind pin the
job), and a lease with no CPUs gets ``none``.

The decision (`decide`) is pure: facts in, verdict out. `read_facts` reads the facts
through a HostRoot, so a fixture tree can model each kind of host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from topod.host import HostRoot

MODES = ("cgroup", "affinity", "none")
V1_CONTROLLERS = frozenset({"cpuset", "cpu", "cpuacct", "memory", "devices", "freezer", "net_cls", "blkio",
                            "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc"})
AFFINITY_NOTE = "topoctl run and topoctl bind pin the job with sched_setaffinity; the job may undo it"


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    """What the host tree shows about cgroups and systemd."""

    layout: str  # unified | hybrid | legacy | none
    v2_controllers: frozenset[str]  # offered by the unified hierarchy's root
    v2_subtree_control: frozenset[str]  # enabled below the root
    v1_controllers: frozenset[str]  # bound to v1 hierarchies
    systemd: bool  # /run/systemd/system is a directory (sd_booted)
    live: bool  # the root is the host topod runs on
    affinity: bool  # this platform has sched_setaffinity


@dataclass(frozen=True, slots=True)
class Enforcement:
    mode: str  # what the host can enforce: cgroup | affinity | none
    reason: str  # one line: why this mode and not a stronger one
    facts: CgroupFacts

    def to_json(self) -> dict:
        facts = self.facts
        return {
            "host": self.mode,
            "leases": lease_mode(self.mode),
            "reason": self.reason,
            "cgroup_layout": facts.layout,
            "cpuset": "v2" if "cpuset" in facts.v2_controllers else "v1" if "cpuset" in facts.v1_controllers
            else "absent",
            "systemd": facts.systemd,
        }


def parse_mounts(text: str) -> tuple[str | None, dict[str, set[str]]]:
    """(/proc/self/mounts) -> (the cgroup2 mount point or None, {v1 mount point: controllers})."""
    unified: str | None = None
    legacy: dict[str, set[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, options = fields[1], fields[2], fields[3]
        if fstype == "cgroup2":
            if unified is None or point == "/sys/fs/cgroup":
                unified = point
        elif fstype == "cgroup":
            legacy[point] = {opt for opt in options.split(",") if opt in V1_CONTROLLERS}
    return unified, legacy


def _words(text: str | None) -> frozenset[str]:
    return frozenset((text or "").split())


def read_facts(host: HostRoot, *, live: bool | None = None) -> CgroupFacts:
    """The facts, read through `host`. live: treat the root as the running host (tests
    that model a host with a fixture tree); default: whether it is."""
    mounts = host.read("proc/self/mounts") or host.read("proc/mounts") or ""
    unified, legacy = parse_mounts(mounts)
    v1 = frozenset(c for controllers in legacy.values() for c in controllers)
    if unified == "/sys/fs/cgroup":
        layout = "unified"
    elif unified is not None:
        layout = "hybrid" if legacy else "unified-elsewhere"
    else:
        layout = "legacy" if legacy else "none"
    base = (unified or "/sys/fs/cgroup").lstrip("/")
    controllers = _words(host.read(f"{base}/cgroup.controllers")) if unified else frozenset()
    subtree = _words(host.read(f"{base}/cgroup.subtree_control")) if unified else frozenset()
    return CgroupFacts(
        layout=layout, v2_controllers=controllers, v2_subtree_control=subtree, v1_controllers=v1,
        systemd=host.is_dir("run/systemd/system"),
        live=host.is_live if live is None else live,
        affinity=hasattr(os, "sched_setaffinity"),
    )


def decide(facts: CgroupFacts) -> Enforcement:
    """The strongest mode the facts allow, with the reason the stronger one is out."""
    if not facts.live:
        return Enforcement("none", "the root is a captured host tree, not the host topod runs on: "
                                   "its CPUs and devices are not this machine's", facts)
    if not facts.affinity:
        return Enforcement("none", "this platform has no sched_setaffinity", facts)
    if facts.layout != "unified":
        where = {"hybrid": "cgroups are mounted hybrid (v1 controllers, v2 only for tracking)",
                 "legacy": "cgroups are v1 only", "none": "no cgroup hierarchy is mounted",
                 "unified-elsewhere": "the unified hierarchy is not mounted at /sys/fs/cgroup"}[facts.layout]
        extra = " (cpuset is on a v1 hierarchy: systemd's AllowedCPUs= has no effect)" \
            if "cpuset" in facts.v1_controllers else ""
        return Enforcement("affinity", f"{where}{extra}; CPUs held by affinity only", facts)
    if "cpuset" not in facts.v2_controllers:
        return Enforcement("affinity", "cgroup v2 without the cpuset controller; CPUs held by affinity only", facts)
    if not facts.systemd:
        return Enforcement("affinity", "cgroup v2 with cpuset, but systemd is not running (no /run/systemd/system) "
                                       "to delegate it; CPUs held by affinity only", facts)
    return Enforcement("cgroup", "cgroup v2 with the cpuset controller, systemd running", facts)


def host_enforcement(host: HostRoot, *, live: bool | None = None) -> Enforcement:
    return decide(read_facts(host, live=live))


def lease_mode(host_mode: str, has_cpus: bool = True) -> str:
    """What a lease gets on a host that can enforce `host_mode`: topod starts no cgroup
    scope for a lease, so never more than affinity; nothing when the lease holds no CPUs."""
    if not has_cpus or host_mode == "none":
        return "none"
    return "affinity"
