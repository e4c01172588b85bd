"""CPUs for the chosen GPUs (pure).

Rules, in order:
- Each GPU gets `cpus_per_gpu` logical CPUs on its own NUMA node, as whole physical
  cores: all online hyper-threads of a core together. cpus_per_gpu counts logical CPUs
  and is rounded up to whole cores (3 on a 2-thread machine -> 2 cores, 4 CPUs); the
  decision says so.
- Never an isolated or nohz_full CPU, a CPU held by a lease, or a reserved
  (housekeeping) CPU; a core with any such thread is not used at all.
- Each GPU's cores are contiguous (consecutive cores of the node, no core between them
  skipped) and share one last-level cache, preferring cores in the GPU's PCIe
  local_cpulist; the first such window wins, so successive GPUs get successive blocks.
  When no window fits, the node's free cores are taken, fullest L3 first, and the
  decision says they are not contiguous (the pick within a node: topod.alloc.windows).
- Not enough near cores: 'insufficient_cpus' at levels best and good. At level 'any'
  the GPU gets cores from the nearest node by SLIT distance that has them (ties: lower
  node id), and the decision marks cpu_fallback with the node used.
- cpus_per_gpu "auto" (the daemon's default): each GPU gets its node's fair share, the
  node's usable whole cores (not reserved, isolated or nohz_full; leases do not count,
  so the share does not shrink as the node fills) less one core left for the system,
  divided by the node's GPUs, at least one core (fair_share).
- auto never makes a request impossible on an empty host. When a set puts more GPUs on
  a node than its usable cores can give full shares (fewer cores than GPUs: a 64-GPU
  host of 4-core nodes), each of them gets fewer whole cores, at least one; with fewer
  usable cores than GPUs, they share the node's cores; on a node with no usable core,
  one core each from the nearest node (cpu_fallback). Each says so in a 'warning:'
  reason (topod.alloc.nodecores.auto_plan, assign_auto). The degrading follows the
  empty host only: cores held by other leases still make a request wait
  (insufficient_cpus), as they do for a set that gets its full share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from itertools import repeat
from operator import attrgetter, or_

from topod.alloc.errors import InsufficientCpusError
from topod.alloc.nodecores import Core, CoreMap, NodeCores, auto_plan, free_cpus, gpus_served, usable_cores
from topod.alloc.slotinit import slot_init, slot_setters
from topod.alloc.windows import NOWHERE, pick_cores
from topod.model import Cpu, Gpu, Topology

# Logical CPUs per GPU: one number for every node, or per node (the "auto" fair share).
PerGpu = int | Mapping[int, int]
# node_cores results kept per core map (by the cores the excluded CPUs block): the free
# states a host sees repeat (a lease released, another of the same shape granted).
NODE_CORES_MEMO = 1_024
_INDEX = attrgetter("index")


def need(per_gpu: PerGpu, node: int | None) -> int:
    if isinstance(per_gpu, int):
        return per_gpu
    return per_gpu.get(node, 0) if node is not None else 0


def wants_cpus(per_gpu: PerGpu) -> bool:
    return bool(per_gpu) if not isinstance(per_gpu, int) else per_gpu > 0


def fair_share(topology: Topology, reserved: set[int], cmap: CoreMap | None = None) -> dict[int, int]:
    """node -> logical CPUs per GPU under "auto" (see the module doc); nodes without GPUs
    are absent."""
    gpus: dict[int, int] = {}
    for gpu in topology.gpus:
        if gpu.numa_node is not None:
            gpus[gpu.numa_node] = gpus.get(gpu.numa_node, 0) + 1
    share: dict[int, int] = {}
    for node, cores in node_cores(topology, set(reserved), cmap).items():
        if node not in gpus:
            continue
        usable = usable_cores(cores)
        if not usable:
            continue
        per_gpu_cores = max(1, (len(usable) - 1) // gpus[node])
        threads = max(len(core) for core in usable)
        share[node] = per_gpu_cores * threads
    return share


@dataclass(frozen=True, slots=True)
class CoreChoice:
    cpus: dict[int, tuple[int, ...]]  # GPU index -> CPUs
    cpu_node: dict[int, int | None]  # GPU index -> node the CPUs are on
    fallback: bool
    reasons: tuple[str, ...]


_CORE_CHOICE = slot_setters(CoreChoice)


def _core_choice_init(self, cpus, cpu_node, fallback, reasons) -> None:  # noqa: ANN001 - see slotinit.slot_init
    set_cpus, set_cpu_node, set_fallback, set_reasons = _CORE_CHOICE
    set_cpus(self, cpus)
    set_cpu_node(self, cpu_node)
    set_fallback(self, fallback)
    set_reasons(self, reasons)


slot_init(CoreChoice, _core_choice_init)


def core_map(topology: Topology) -> CoreMap:
    by_id = {cpu.id: cpu for cpu in topology.cpus}
    per_node: dict[int, dict[Core, Cpu]] = {}
    for cpu in topology.cpus:
        if not cpu.online or cpu.numa_node is None:
            continue
        core = tuple(sorted(c for c in cpu.physical_core if by_id.get(c) is not None and by_id[c].online))
        per_node.setdefault(cpu.numa_node, {}).setdefault(core or (cpu.id,), cpu)
    nodes = {}
    for node, cores in per_node.items():
        ordered = sorted(cores)
        llc = {core: (cores[core].llc if cores[core].llc is not None else -1) for core in ordered}
        eligible = frozenset(core for core in ordered if all(_eligible(by_id.get(c)) for c in core))
        nodes[node] = (ordered, llc, eligible)
    core_of: dict[int, list[tuple[int, Core]]] = {}
    cpu_bits: dict[int, int] = {}
    offset: dict[int, int] = {}
    eligible_bits: dict[int, int] = {}
    marks: dict[Core, list[tuple[int, int]]] = {}
    start = 0
    for node, (ordered, _, eligible) in nodes.items():
        offset[node] = start
        eligible_bits[node] = sum(1 << i for i, core in enumerate(ordered) if core in eligible)
        for i, core in enumerate(ordered):
            marks.setdefault(core, []).append((node, 1 << i))
            for c in core:
                core_of.setdefault(c, []).append((node, core))
                cpu_bits[c] = cpu_bits.get(c, 0) | 1 << (start + i)
        start += len(ordered)
    local = {}
    for gpu in topology.gpus:
        device = topology.device(gpu.address)
        local[gpu.address] = frozenset(device.local_cpus) if device is not None else frozenset()
    return CoreMap(nodes, {c: tuple(where) for c, where in core_of.items()}, local, cpu_bits=cpu_bits, offset=offset,
                   eligible=eligible_bits, marks={core: tuple(where) for core, where in marks.items()})


def node_cores(topology: Topology, excluded: set[int] | frozenset[int],
               cmap: CoreMap | None = None) -> dict[int, NodeCores]:
    """node -> its cores; `excluded` = leased | reserved CPUs. A core is usable when it
    is eligible and none of its CPUs is excluded: the cores excluded CPUs block are
    looked up per CPU (as bits, across the map), so the cost follows what is taken, not
    the host's size; kept on the map by those bits (the same cores blocked, the same map)."""
    cmap = cmap or core_map(topology)
    whole = cmap.whole
    if not whole:  # each node with nothing excluded, built once per map and shared (read only)
        whole.update({node: NodeCores(ordered, cmap.eligible[node], llc, node)
                      for node, (ordered, llc, _) in cmap.nodes.items()})
    blocked = reduce(or_, map(cmap.cpu_bits.get, excluded, repeat(0)), 0)
    memo = cmap.blocked_memo
    known = memo.get(blocked)
    if known is not None:
        return known
    if not blocked:
        out = dict(whole)
    else:
        out = {}
        offset = cmap.offset
        for node, cores in whole.items():
            mine = blocked >> offset[node] & cores.free
            out[node] = NodeCores(cores.all_cores, cores.free & ~mine, cores.llc, node) if mine else cores
    if len(memo) >= NODE_CORES_MEMO:
        del memo[next(iter(memo))]
    memo[blocked] = out
    return out


def _eligible(cpu: Cpu | None) -> bool:
    return cpu is not None and cpu.online and not cpu.isolated and not cpu.nohz_full


def node_capacity(topology: Topology, excluded: set[int], cpus_per_gpu: PerGpu,
                  cmap: CoreMap | None = None, now: Mapping[int, NodeCores] | None = None) -> dict[int, int]:
    """node -> how many GPUs its free cores can serve at cpus_per_gpu (the search's CPU
    constraint; nodes absent serve none). `now`: node_cores for `excluded`, if at hand."""
    if not wants_cpus(cpus_per_gpu):
        return {}
    capacity: dict[int, int] = {}
    for node, cores in (now if now is not None else node_cores(topology, excluded, cmap)).items():
        wanted = need(cpus_per_gpu, node)
        if wanted <= 0:
            capacity[node] = 0
            continue
        capacity[node] = gpus_served(usable_cores(cores), wanted)
    return capacity


def auto_table(topology: Topology, share: Mapping[int, int], reserved: set[int], gpus_on: Mapping[int, int],
               cmap: CoreMap | None = None) -> dict[int, tuple[list[int | None], int]]:
    """node -> (auto_plan's CPUs per GPU for 1..all of its GPUs in one set, its usable
    cores on the empty host): what auto_capacity checks against the free cores. Depends
    on the host and the reserved CPUs only (the engine keeps it per view)."""
    empty = node_cores(topology, set(reserved), cmap)
    return {node: ([auto_plan({node: m}, share, empty)[node] for m in range(1, total + 1)],
                   empty[node].free.bit_count() if node in empty else 0)
            for node, total in gpus_on.items()}


def auto_capacity(topology: Topology, table: Mapping[int, tuple[list[int | None], int]], excluded: set[int],
                  cmap: CoreMap | None = None, now: Mapping[int, NodeCores] | None = None) -> dict[int, int]:
    """node -> how many GPUs of one set it can take under auto (the search's CPU
    constraint): the largest m such that 1..m GPUs all get their auto_plan share from
    the node's free cores (the fair share where the empty node holds it, else degraded;
    a shared node needs all the cores it would share free). `now`: node_cores for
    `excluded`, if the caller has it already."""
    if now is None:
        now = node_cores(topology, set(excluded), cmap)
    # Per node a function of its plans and its free cores: kept on the map by their values.
    memo = cmap.capacity_memo if cmap is not None else {}
    if len(memo) > 4096:
        memo.clear()
    capacity: dict[int, int] = {}
    for node, (plans, usable) in table.items():
        cores = now.get(node)
        key = (node, tuple(plans), usable, cores.free if cores is not None else None)
        known = memo.get(key)
        if known is not None:
            capacity[node] = known
            continue
        free = usable_cores(cores)
        served: dict[int, int] = {}
        m = 0
        for wanted in plans:
            if wanted is None:  # no usable core here at all: the nearest node's, whatever the count
                m = len(plans)
                break
            if wanted == 0:
                if len(free) < usable:
                    break
            else:
                if wanted not in served:
                    served[wanted] = gpus_served(free, wanted)
                if served[wanted] < m + 1:
                    break
            m += 1
        capacity[node] = memo[key] = m
    return capacity


def assign_auto(topology: Topology, gpus: list[Gpu], share: Mapping[int, int], excluded: set[int],
                reserved: set[int], allow_fallback: bool, cmap: CoreMap | None = None) -> CoreChoice:
    """CPUs under auto for a set some node cannot give full shares on the empty host
    (auto_plan): fewer whole cores, shared cores or the nearest node's, each warned."""
    counts: dict[int | None, int] = {}
    for gpu in gpus:
        counts[gpu.numa_node] = counts.get(gpu.numa_node, 0) + 1
    empty = node_cores(topology, set(reserved), cmap)
    plan = auto_plan(counts, share, empty)
    taken = set(excluded)
    cpus: dict[int, tuple[int, ...]] = {}
    where: dict[int, int | None] = {}
    reasons: list[str] = []
    fallback = False
    nearest: list[Gpu] = []
    for node in sorted(counts, key=lambda v: (v is None, v or 0)):
        members = sorted((g for g in gpus if g.numa_node == node), key=lambda g: g.index)
        wanted = plan[node]
        usable = empty[node].free.bit_count() if node in empty else 0
        if wanted is None:
            nearest.extend(members)
            reasons.append(f"warning: cpus_per_gpu auto: node {node} has no usable whole core; GPU "
                           f"{', '.join(str(g.index) for g in members)} take one core each from the nearest node")
            continue
        if wanted == 0:
            free = usable_cores(node_cores(topology, taken, cmap)[node])
            if len(free) < usable:  # other leases hold some: wait, as for a full share
                if not allow_fallback:
                    raise InsufficientCpusError(
                        f"GPU {', '.join(str(g.index) for g in members)} would share node {node}'s {usable} usable "
                        f"whole cores (fewer than its GPUs); other leases hold {usable - len(free)} of them")
                nearest.extend(members)
                continue
            for j, gpu in enumerate(members):
                cpus[gpu.index] = tuple(sorted(free[j % len(free)]))
                where[gpu.index] = node
            taken.update(c for core in free for c in core)
            reasons.append(f"warning: cpus_per_gpu auto: node {node} has {usable} usable whole cores for the "
                           f"{len(members)} GPUs of this set on it: they share its {len(free)} free cores, "
                           f"one each in turn (less than the fair share of {share.get(node, 0)} CPUs per GPU)")
            continue
        choice = assign_cpus(topology, members, {node: wanted}, taken, allow_fallback, cmap, describe=False)
        reasons.extend(choice.reasons)
        fallback |= choice.fallback
        for gpu in members:
            cpus[gpu.index] = choice.cpus[gpu.index]
            where[gpu.index] = choice.cpu_node[gpu.index]
            taken.update(choice.cpus[gpu.index])
        if wanted < share.get(node, 0):
            reasons.append(f"warning: cpus_per_gpu auto: node {node} has {usable} usable whole cores for the "
                           f"{len(members)} GPUs of this set on it: {wanted} CPUs per GPU, less than its fair "
                           f"share of {share[node]}")
        else:
            reasons.append(f"cpus_per_gpu auto: each GPU's fair share of node {node} ({wanted} CPUs per GPU)")
    if nearest:
        one = min((len(core) for cores in empty.values() for core in usable_cores(cores)), default=1)
        choice = assign_cpus(topology, nearest, one, taken, True, cmap, describe=False)
        reasons.extend(choice.reasons)
        fallback |= choice.fallback
        cpus.update(choice.cpus)
        where.update(choice.cpu_node)
    return CoreChoice(cpus, where, fallback, tuple(reasons))


def assign_cpus(topology: Topology, gpus: list[Gpu], per_gpu: PerGpu, excluded: set[int],
                allow_fallback: bool, cmap: CoreMap | None = None, *, describe: bool = True,
                now: Mapping[int, NodeCores] | None = None) -> CoreChoice:
    """`now`: node_cores for `excluded`, if the caller has it already."""
    if not wants_cpus(per_gpu):
        return CoreChoice({g.index: () for g in gpus}, {g.index: g.numa_node for g in gpus}, False, ())
    cmap = cmap or core_map(topology)
    cores = now if now is not None else node_cores(topology, excluded, cmap)
    taken: dict[int, int] = {}  # node -> the cores this call gave, as bits
    cpus: dict[int, tuple[int, ...]] = {}
    where: dict[int, int | None] = {}
    reasons: list[str] = []
    fallback = False
    wanted_sizes: set[int] = set()
    for gpu in sorted(gpus, key=_INDEX) if len(gpus) > 1 else gpus:
        cpus_per_gpu = need(per_gpu, gpu.numa_node) or max(per_gpu.values()) if not isinstance(per_gpu, int) \
            else per_gpu
        wanted_sizes.add(cpus_per_gpu)
        local = cmap.local.get(gpu.address, frozenset())
        picked = pick_cores(cmap, cores.get(gpu.numa_node), taken, cpus_per_gpu, local, reasons, gpu.index) \
            if gpu.numa_node is not None else None
        node = gpu.numa_node
        if picked is None:
            free = free_cpus(cores.get(gpu.numa_node), taken) if gpu.numa_node is not None else 0
            if not allow_fallback:
                home = f"node {gpu.numa_node}" if gpu.numa_node is not None else "an unknown NUMA node"
                raise InsufficientCpusError(
                    f"GPU {gpu.index} is on {home}, which has {free} free whole-core CPUs; {cpus_per_gpu} needed "
                    "(level 'any' would take CPUs from the nearest other node)")
            for other in _nearest_nodes(topology, gpu.numa_node):
                picked = pick_cores(cmap, cores.get(other), taken, cpus_per_gpu, NOWHERE, reasons, gpu.index)
                if picked is not None:
                    node = other
                    fallback = True
                    reasons.append(f"GPU {gpu.index}: CPUs from node {other}, the nearest with free cores "
                                   f"(node {gpu.numa_node} has {free} free; level 'any' fallback)")
                    break
            if picked is None:
                raise InsufficientCpusError(f"GPU {gpu.index}: no NUMA node has {cpus_per_gpu} free whole-core CPUs")
        for v, bits in picked[1]:
            taken[v] = taken.get(v, 0) | bits
        cpus[gpu.index] = picked[0]
        where[gpu.index] = node
    if not describe:
        pass
    elif isinstance(per_gpu, int):
        granted = {len(v) for v in cpus.values()}
        if any(size > per_gpu for size in granted):
            reasons.append(f"cpus_per_gpu {per_gpu} rounded up to whole physical cores "
                           f"({', '.join(str(s) for s in sorted(granted))} CPUs per GPU)")
    else:
        reasons.append(f"cpus_per_gpu auto: each GPU's fair share of its node "
                       f"({', '.join(map(str, sorted(wanted_sizes)))} CPUs per GPU)")
    return CoreChoice(cpus, where, fallback, tuple(reasons))


def _nearest_nodes(topology: Topology, home: int | None) -> list[int]:
    nodes = [node for node in topology.numa_nodes if node.has_cpus and node.id != home]
    origin = topology.node(home) if home is not None else None
    return [node.id for node in sorted(nodes, key=lambda n: ((origin.distances.get(n.id, 255) if origin else 0), n.id))]
