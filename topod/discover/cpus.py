"""CPUs from sys/devices/system/cpu: online state, core, package, siblings, LLC."""

from __future__ import annotations

import re
from dataclasses import dataclass

from topod.cpulist import parse_cpulist
from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import Cpu

CPU_DIR = "sys/devices/system/cpu"
_CPU_NAME = re.compile(r"^cpu(\d+)$")


@dataclass(slots=True)
class CpuFacts:
    """What the CPU directory says before NUMA nodes are known."""

    present: list[int]
    online: set[int]
    isolated: set[int]
    nohz_full: set[int]


def read_cpulist_file(host: HostRoot, rel: str, notes: Notes, *, required: bool = False) -> list[int] | None:
    text = host.read(rel)
    if text is not None and text.strip() == "(null)":
        return []  # what some kernels print for an empty nohz_full
    if text is None:
        if required:
            notes.add("missing_file", rel, "file missing or unreadable")
        return None
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        notes.add("bad_value", rel, f"not a CPU list ({exc}); ignored")
        return None


def read_cpu_facts(host: HostRoot, notes: Notes) -> CpuFacts:
    present = sorted(
        int(match.group(1)) for name in host.listdir(CPU_DIR) if (match := _CPU_NAME.match(name))
    )
    online_list = read_cpulist_file(host, f"{CPU_DIR}/online", notes)
    if online_list is None:
        online = {cpu for cpu in present if _cpu_dir_says_online(host, cpu)}
        notes.add(
            "missing_file", f"{CPU_DIR}/online", "online CPU list missing; used each cpuN/online instead"
        )
    else:
        online = set(online_list)
    isolated = set(read_cpulist_file(host, f"{CPU_DIR}/isolated", notes) or [])
    nohz_full = set(read_cpulist_file(host, f"{CPU_DIR}/nohz_full", notes) or [])
    return CpuFacts(present=present, online=online, isolated=isolated, nohz_full=nohz_full)


def _cpu_dir_says_online(host: HostRoot, cpu: int) -> bool:
    flag = host.read_line(f"{CPU_DIR}/cpu{cpu}/online")
    # cpu0 often has no 'online' file because it cannot be taken offline.
    return flag != "0"


def _read_int(host: HostRoot, rel: str) -> int | None:
    text = host.read_line(rel)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _last_level_cache(host: HostRoot, cpu: int, notes: Notes) -> int | None:
    """The LLC domain as the lowest CPU id sharing the highest-level unified/data cache."""
    base = f"{CPU_DIR}/cpu{cpu}/cache"
    best_level = -1
    best_shared: list[int] | None = None
    for name in host.listdir(base):
        if not name.startswith("index"):
            continue
        if host.read_line(f"{base}/{name}/type") == "Instruction":
            continue
        level = _read_int(host, f"{base}/{name}/level")
        if level is None or level <= best_level:
            continue
        shared = read_cpulist_file(host, f"{base}/{name}/shared_cpu_list", notes)
        if shared:
            best_level, best_shared = level, shared
    return min(best_shared) if best_shared else None


def read_cpus(host: HostRoot, facts: CpuFacts, node_of_cpu: dict[int, int], notes: Notes) -> list[Cpu]:
    cpus: list[Cpu] = []
    known = sorted(set(facts.present) | facts.online)
    for cpu in known:
        online = cpu in facts.online
        topo = f"{CPU_DIR}/cpu{cpu}/topology"
        siblings: list[int] = []
        core = package = llc = None
        if online:
            core = _read_int(host, f"{topo}/core_id")
            package = _read_int(host, f"{topo}/physical_package_id")
            siblings = read_cpulist_file(host, f"{topo}/thread_siblings_list", notes) or []
            if not siblings:
                siblings = read_cpulist_file(host, f"{topo}/core_cpus_list", notes) or [cpu]
            siblings = sorted(s for s in siblings if s in facts.online) or [cpu]
            llc = _last_level_cache(host, cpu, notes)
        cpus.append(
            Cpu(
                id=cpu,
                online=online,
                core=core,
                package=package,
                numa_node=node_of_cpu.get(cpu),
                siblings=tuple(siblings),
                llc=llc,
                isolated=cpu in facts.isolated,
                nohz_full=cpu in facts.nohz_full,
            )
        )
    return cpus
