"""CPUs from sys/devices/system/cpu: online state, core, package, siblings, LLC."""

from __future__ import annotations

from topod.cpulist import MAX_CPUS, CpuListRangeError, parse_cpulist, parse_cpumask
from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import Cpu
from topod.record import record
from topod.sysnames import numbered

CPU_DIR = "sys/devices/system/cpu"


@record(frozen=False)
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
        return parse_cpulist(text, notes.cpu_limit)
    except CpuListRangeError as exc:
        notes.add("cpulist_out_of_range", rel, f"{exc}; ignored")
        return None
    except ValueError as exc:
        notes.add("bad_value", rel, f"not a CPU list ({exc}); ignored")
        return None


def read_cpu_set(host: HostRoot, list_rel: str, mask_rel: str, notes: Notes,
                 instead: str = "ignored") -> list[int] | None:
    """A CPU set from its list file, else from the mask file beside it: older kernels
    (hwloc's 16em64t, 96em64t and 256ia64 trees, among others) have only the masks
    (topology/thread_siblings, cache/indexN/shared_cpu_map, a node's cpumap). None when
    neither is there or usable; an unusable mask is noted, ending with `instead` (what
    the caller does without it)."""
    listed = read_cpulist_file(host, list_rel, notes)
    if listed is not None:
        return listed
    text = host.read(mask_rel)
    if text is None:
        return None
    try:
        return parse_cpumask(text, notes.cpu_limit)
    except CpuListRangeError as exc:
        notes.add("cpulist_out_of_range", mask_rel, f"{exc}; {instead}")
    except ValueError:
        notes.add("bad_value", mask_rel, f"not a CPU mask; {instead}")
    return None


def read_cpu_facts(host: HostRoot, notes: Notes) -> CpuFacts:
    """Present, online, isolated and nohz_full CPUs; also sets notes.cpu_limit to the
    host's possible CPUs, so no later CPU list can name (or expand to) more."""
    present = []
    for name in host.listdir(CPU_DIR):
        if (cpu := numbered(name, "cpu")) is not None:
            if cpu < MAX_CPUS:
                present.append(cpu)
            else:
                notes.add("cpulist_out_of_range", f"{CPU_DIR}/{name}", f"CPU id beyond the {MAX_CPUS}-CPU limit; ignored")
    present.sort()
    possible = read_cpulist_file(host, f"{CPU_DIR}/possible", notes)
    if possible:
        notes.cpu_limit = max(possible[-1], present[-1] if present else 0) + 1
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


# cpu -> (its cache index names, its LLC domain), learnt from other CPUs' LLC lists.
LlcMemo = dict[int, tuple[tuple[str, ...], int]]


def _last_level_cache(host: HostRoot, cpu: int, notes: Notes, memo: LlcMemo) -> int | None:
    """The LLC domain as the lowest CPU id sharing the highest-level unified/data cache.

    Every CPU in that cache's shared_cpu_list shares the same cache, so its LLC domain is
    the same: it is remembered for them, and a CPU with the same cache index entries
    takes it without reading its own (one listing instead of ~10 reads per CPU)."""
    base = f"{CPU_DIR}/cpu{cpu}/cache"
    names = tuple(name for name in host.listdir(base) if name.startswith("index"))
    known = memo.get(cpu)
    if known is not None and known[0] == names:
        return known[1]
    best_level = -1
    best_shared: list[int] | None = None
    for name in names:
        if host.read_line(f"{base}/{name}/type") == "Instruction":
            continue
        level = _read_int(host, f"{base}/{name}/level")
        if level is None or level <= best_level:
            continue
        shared = read_cpu_set(host, f"{base}/{name}/shared_cpu_list", f"{base}/{name}/shared_cpu_map", notes)
        if shared:
            best_level, best_shared = level, shared
    if not best_shared:
        return None
    llc = min(best_shared)
    if cpu in best_shared:  # a list that leaves its own CPU out is not trusted for others
        for other in best_shared:
            memo.setdefault(other, (names, llc))
    return llc


def read_cpus(host: HostRoot, facts: CpuFacts, node_of_cpu: dict[int, int], notes: Notes) -> list[Cpu]:
    cpus: list[Cpu] = []
    llc_memo: LlcMemo = {}
    known = sorted(set(facts.present) | facts.online)
    for cpu in known:
        online = cpu in facts.online
        topo = f"{CPU_DIR}/cpu{cpu}/topology"
        siblings: list[int] = []
        core = package = llc = None
        if online:
            core = _read_int(host, f"{topo}/core_id")
            package = _read_int(host, f"{topo}/physical_package_id")
            if package is not None and package < 0:
                package = None  # -1: the kernel does not know it (POWER, s390)
            siblings = read_cpu_set(host, f"{topo}/thread_siblings_list", f"{topo}/thread_siblings", notes) or []
            if not siblings:
                siblings = read_cpu_set(host, f"{topo}/core_cpus_list", f"{topo}/core_cpus", notes) or [cpu]
            siblings = sorted(s for s in siblings if s in facts.online) or [cpu]
            llc = _last_level_cache(host, cpu, notes, llc_memo)
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
