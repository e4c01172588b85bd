"""What the engine derives once per (Topology, DistanceModel): weights by GPU position,
groups (NUMA node, root complex, PCIe switch, NVLink island), twin classes, bandwidths.

Computing a 64x64 weight matrix through DistanceModel takes milliseconds; a decision
must not, so the view is memoised on the DistanceModel itself (the daemon builds a new
model whenever the topology or corrections change; the view goes with the old one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topod.alloc.estimate import pair_bandwidth, pcie_gbps
from topod.distance import Distance, DistanceModel
from topod.model import Gpu, Topology

# The search minimises cost + DELTA_NODE x (pairs crossing NUMA nodes): among equal-cost
# sets (an NVSwitch island spanning both sockets) the one on fewer nodes wins, while any
# real cost difference above 1e-5 per crossing pair still dominates.
DELTA_NODE = 1e-5
TWIN_TOLERANCE = 1e-9
UNKNOWN_NODE = -1
# The census enumerates class mixes (how many GPUs of each twin class), at most this many:
# 81 on an 8-GPU host of four PCIe switches, 256 on the cube mesh, 6561 (about 20 ms, once)
# on a 16-GPU host of eight classes of two. Bigger hosts skip the look-ahead, which keeps
# their decisions within the latency goals; phi alone breaks their ties.
CENSUS_LIMIT = 8192


@dataclass(slots=True)
class HostView:
    topology: Topology
    distances: DistanceModel
    gpus: tuple[Gpu, ...]
    position: dict[int, int]  # GPU index -> position
    node: list[int]  # position -> NUMA node (UNKNOWN_NODE when unknown)
    groups: list[tuple[tuple[str, object], ...]]  # position -> informative groups (>= 2 GPUs)
    group_size: dict[tuple[str, object], int]
    distance: list[list[Distance]]
    weight: list[list[float]]  # true pairwise weights
    search_weight: list[list[float]]  # weight + DELTA_NODE when the pair crosses nodes
    twin: list[int]  # position -> static twin class id
    bandwidth: list[list[float]]
    unknown_link: tuple[int, ...]  # GPU indices whose PCIe link rate is unknown
    mean_weight: float
    node_gpus: dict[int, int]  # node -> GPUs on it
    cache: dict = field(default_factory=dict)  # reference results (engine.py)
    search_memo: dict = field(default_factory=dict)  # search arguments -> result (viewsearch.search_view)
    decision_memo: dict = field(default_factory=dict)  # request, policy, free state -> Decision (engine.allocate)
    everyone: list[int] = field(default_factory=list)  # every position: an unfiltered request's candidates

    @property
    def n(self) -> int:
        return len(self.gpus)

    def resolve(self, item: int | str) -> int | None:
        """A must_include item (index, PCI address, UUID) -> position."""
        for position, gpu in enumerate(self.gpus):
            if gpu.index == item or (isinstance(item, str) and item.lower() in (gpu.address.lower(),
                                                                               (gpu.uuid or "").lower())):
                return position
        return None


def host_view(topology: Topology, distances: DistanceModel) -> HostView:
    view = distances.memo.get("host_view")
    if view is not None and view.topology is topology:
        return view
    view = _build(topology, distances)
    distances.memo["host_view"] = view
    return view


def fresh_view(topology: Topology, distances: DistanceModel) -> HostView:
    """A view of its own, not memoised on the model: engine.prepare fills one in a worker
    thread while decisions on the loop go on using (or building) the memoised one."""
    return _build(topology, distances)


def install_view(view: HostView) -> None:
    """Make a view filled apart (fresh_view, then engine.prepare) the one decisions use.
    Call it on the thread that makes decisions, never concurrently with one. What a
    decision cached meanwhile in the model's own view of the same topology is kept where
    the prepared view has nothing for that key."""
    memo = view.distances.memo
    old = memo.get("host_view")
    if old is not None and old.topology is view.topology:
        for key, value in old.cache.items():
            view.cache.setdefault(key, value)
        for key, value in old.search_memo.items():
            view.search_memo.setdefault(key, value)
        for key, value in old.decision_memo.items():
            view.decision_memo.setdefault(key, value)
    memo["host_view"] = view


def _build(topology: Topology, distances: DistanceModel) -> HostView:
    gpus = tuple(topology.gpus)
    n = len(gpus)
    node = [gpu.numa_node if gpu.numa_node is not None else UNKNOWN_NODE for gpu in gpus]
    raw_groups = [_raw_groups(topology, gpu, node[p]) for p, gpu in enumerate(gpus)]
    size: dict[tuple[str, object], int] = {}
    for keys in raw_groups:
        for key in keys:
            size[key] = size.get(key, 0) + 1
    # A group of one GPU says nothing about packing; leaving it out keeps more twins.
    groups = [tuple(key for key in keys if size[key] >= 2) for keys in raw_groups]
    distance = [[distances.gpus(a.index, b.index) for b in gpus] for a in gpus]
    weight = [[d.weight if i != j else 0.0 for j, d in enumerate(row)] for i, row in enumerate(distance)]
    search = [[w + (DELTA_NODE if node[i] != node[j] else 0.0) for j, w in enumerate(row)]
              for i, row in enumerate(weight)]
    rates = [pcie_gbps(topology.device(gpu.address)) for gpu in gpus]
    bandwidth = [[pair_bandwidth(distance[i][j], rates[i], rates[j]) if i != j else float("inf")
                  for j in range(n)] for i in range(n)]
    pairs = n * (n - 1)
    node_gpus: dict[int, int] = {}
    for value in node:
        node_gpus[value] = node_gpus.get(value, 0) + 1
    return HostView(
        topology=topology, distances=distances, gpus=gpus,
        position={gpu.index: p for p, gpu in enumerate(gpus)},
        node=node, groups=groups, group_size={k: v for k, v in size.items() if v >= 2},
        distance=distance, weight=weight, search_weight=search,
        twin=_twins(gpus, node, groups, search),
        bandwidth=bandwidth,
        unknown_link=tuple(gpu.index for gpu, rate in zip(gpus, rates) if rate is None),
        mean_weight=(sum(map(sum, weight)) / pairs) if pairs else 0.0,
        node_gpus=node_gpus,
        everyone=list(range(n)),
    )


Census = tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # (size, ((twin class, count), ...)), by size


def best_set_census(view: HostView) -> Census | None:
    """Every set of every size >= 2 whose search cost (the pairwise weights plus
    DELTA_NODE per pair crossing NUMA nodes, exactly what the search minimises) is the
    minimum for its size on the empty host, as class mixes; the engine counts how many of
    them a choice leaves free. Raw weights would count a cross-socket pair as good as the
    search's own best pairs (a DGX-1's NVLinks between sockets), though the search never
    grants it while a same-node one of equal weight is free: the look-ahead then kept
    pairs nobody gets and broke the ones granted next. None when the host has more than
    CENSUS_LIMIT mixes, or when every set of a size costs the same (one NVSwitch island:
    nothing to keep). Memoised on the view."""
    if "census" not in view.cache:
        view.cache["census"] = _census(view)
    return view.cache["census"]


def _census(view: HostView) -> Census | None:
    members: dict[int, list[int]] = {}
    for p, c in enumerate(view.twin):
        members.setdefault(c, []).append(p)
    groups = [members[c] for c in range(len(members))]  # twin ids run 0..count-1
    mixes = 1
    for group in groups:
        mixes *= len(group) + 1
    if mixes > CENSUS_LIMIT:
        return None
    w = view.search_weight
    intra = [w[g[0]][g[1]] if len(g) > 1 else 0.0 for g in groups]
    inter = [[w[a[0]][b[0]] for b in groups] for a in groups]
    found: dict[int, list[tuple[float, tuple[tuple[int, int], ...]]]] = {}
    counts = [0] * len(groups)

    def visit(c: int, size: int, cost: float) -> None:
        if c == len(groups):
            if size >= 2:
                found.setdefault(size, []).append((cost, tuple((d, x) for d, x in enumerate(counts) if x)))
            return
        for x in range(len(groups[c]) + 1):
            counts[c] = x
            pairs = intra[c] * x * (x - 1) / 2 + x * sum(inter[c][d] * counts[d] for d in range(c))
            visit(c + 1, size + x, cost + pairs)
        counts[c] = 0

    visit(0, 0, 0.0)
    out = []
    for size in sorted(found):
        low = min(cost for cost, _ in found[size])
        out.extend((size, mix) for cost, mix in found[size] if cost <= low + 1e-9 * (1.0 + abs(low)))
    return tuple(out) if len(out) < sum(map(len, found.values())) else None


def _raw_groups(topology: Topology, gpu: Gpu, node: int) -> tuple[tuple[str, object], ...]:
    keys: list[tuple[str, object]] = [("node", node)]
    device = topology.device(gpu.address)
    if device is not None:
        keys.append(("root_complex", device.root_complex))
        if device.switch:
            keys.append(("switch", device.switch))
    island = topology.nvlink.island_of(gpu.index)
    if island:
        keys.append(("island", island))
    hive = topology.nvlink.hive_of(gpu.index) if topology.nvlink.hives else None
    if hive:
        keys.append(("hive", hive))  # an xGMI hive is all-to-all, as an NVSwitch island
    return tuple(keys)


def _twins(gpus, node, groups, search) -> list[int]:
    """Static twin classes: GPUs interchangeable in every term the search uses (same
    weight to every other GPU, same node, groups, model and memory). Twins shrink the
    search from subsets of GPUs to counts per class; twin-ness is transitive."""
    n = len(gpus)
    twin = [-1] * n
    buckets: dict[tuple, list[int]] = {}
    next_id = 0
    for p, gpu in enumerate(gpus):
        key = (node[p], groups[p], gpu.name, gpu.memory_total_mib)
        reps = buckets.setdefault(key, [])
        for rep in reps:
            if all(abs(search[p][z] - search[rep][z]) <= TWIN_TOLERANCE for z in range(n) if z != p and z != rep):
                twin[p] = twin[rep]
                break
        else:
            twin[p] = next_id
            next_id += 1
            reps.append(p)
    return twin
