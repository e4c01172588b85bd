"""GPU-NIC pairing (pure): which RDMA NIC ports a lease's GPUs send through.

A NIC here is one ACTIVE port of a PCI function of kind `rdma` (its `infiniband/` device
name and port number, as NCCL_IB_HCA and UCX_NET_DEVICES name it). A port that is down,
initialising or unreadable is not offered; nothing is offered on a host without RDMA
devices. Distance is the PCIe level between the GPU and the NIC function, the same levels
as between GPUs (topod.distance): PIX/PXB (same switch) < PHB (same root complex) < NODE
(same NUMA node) < SYS (other node, SLIT-weighted).

Policy ([alloc] nics):
- shared (default): each GPU is told its nearest NICs; leases may share a NIC. Among
  equally near NICs, the one fewer leases use comes first.
- exclusive: a NIC belongs to one lease at a time, counted like GPUs. The lease's GPUs
  take free NICs cheapest pair first (greedy over GPU x NIC pairs by distance, which is
  optimal on a tree of switches, root complexes and nodes); among equally near NICs, the
  one that is farthest from every other free GPU (least wanted by anyone else) first.
- none: leases carry no NICs.
A request may ask `nics_per_gpu: N`: then every GPU gets N NICs or the request fails
(insufficient_nics: retryable when NICs in use would do, else not). Without it every
GPU gets its nearest one where there is one (best effort: an exclusive lease's GPU may
get none when all are taken; the decision says so in its reasons).

In exclusive mode without nics_per_gpu, a GPU does not take a NIC that sits under the
PCIe switch of another free GPU (that GPU's own NIC): it gets none rather than leave the
next lease on that switch without one (on the seed with GPU 0's NIC down, taking GPU 2's
would push GPU 2 to GPU 4's, and so on down the host). With nics_per_gpu the nearest
free ones are taken.

The engine adds `tie_break_terms` to its per-GPU objective: NIC_TIE_BREAK x (distance to
the nearest usable NIC / SYS weight; NO_NIC_TERM when none is usable), at most 1e-7 a
GPU: the size of the packing term (1e-7 x phi), far below the node-crossing term (1e-5 a
pair) and any GPU-GPU cost step (>= 0.5). So among equal GPU sets, after the packing
look-ahead, the one with near, free NICs wins; no GPU-GPU cost is ever traded for a NIC,
and NICs do not break up the blocks the look-ahead keeps whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topod.alloc.errors import InsufficientNicsError, InvalidRequestError
from topod.distance import BASE_WEIGHTS, Distance, DistanceModel
from topod.model import Gpu, Topology

NIC_MODES = ("exclusive", "shared", "none")
MAX_NICS_PER_GPU = 16
NIC_TIE_BREAK = 5e-8  # per GPU, times distance / SYS weight; see the module docstring
NEAR_LEVELS = frozenset({"PIX", "PXB"})  # under the GPU's own PCIe switch (tree)
OWN_NIC_WEIGHT = BASE_WEIGHTS["PXB"]  # a NIC this near a GPU is that GPU's own
NO_NIC_TERM = 2.0  # the normalised term of a GPU no usable NIC serves (worse than any SYS)


def nic_key(address: str, port: int) -> str:
    """A NIC port's key: `<PCI address>/<port>`, stable across reboots (not the renumberable name)."""
    return f"{address}/{port}"


@dataclass(frozen=True, slots=True)
class Nic:
    """One offered RDMA port."""

    name: str  # RDMA device, e.g. mlx5_0
    address: str  # its PCI function
    port: int
    numa_node: int | None = None
    link_layer: str | None = None

    @property
    def key(self) -> str:
        """Stable across reboots (PCI address, not the renumberable name): what exclusive counts."""
        return nic_key(self.address, self.port)

    @property
    def hca(self) -> str:
        return f"{self.name}:{self.port}"


@dataclass(frozen=True, slots=True)
class NicChoice:
    """A NIC port given to one GPU of a lease, with its distance level from that GPU."""

    name: str
    address: str
    port: int
    level: str  # PIX | PXB | PHB | NODE | SYS

    @property
    def key(self) -> str:
        return nic_key(self.address, self.port)

    @property
    def hca(self) -> str:
        return f"{self.name}:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "port": self.port, "level": self.level}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> NicChoice:
        return cls(name=str(body["name"]), address=str(body["address"]), port=int(body["port"]),
                   level=str(body.get("level", "SYS")))


def offered_nics(topology: Topology) -> tuple[Nic, ...]:
    """Every ACTIVE port of every RDMA function, by address then port."""
    return tuple(Nic(port.device, device.address, port.port, device.numa_node, port.link_layer)
                 for device in topology.devices_of_kind("rdma") for port in device.rdma_ports if port.active)


def nic_ports_by_state(topology: Topology, leased: Iterable[str]) -> dict[str, int]:
    """{'free', 'leased', 'down'} -> ports; `leased` holds the keys of ports leases carry.
    A port that is not ACTIVE is down, whether leased or not."""
    held = set(leased)
    counts = {"free": 0, "leased": 0, "down": 0}
    for device in topology.devices_of_kind("rdma"):
        for port in device.rdma_ports:
            key = nic_key(device.address, port.port)
            counts["down" if not port.active else "leased" if key in held else "free"] += 1
    return counts


@dataclass(frozen=True, slots=True)
class _Table:
    nics: tuple[Nic, ...]
    distance: dict[str, tuple[Distance, ...]]  # GPU address -> per NIC, in nics order
    keys: tuple[str, ...] = ()  # per NIC, its key (a property builds the string at every call)
    # GPU address -> NIC positions grouped by equal weight, nearest group first, each in
    # nics order: what _shared sorts by, with only the use counts left to order a group.
    tiers: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    choices: dict[str, tuple[NicChoice, ...]] = field(default_factory=dict)  # GPU address -> per NIC
    nearest: dict[str, float] = field(default_factory=dict)  # GPU address -> weight of its nearest NIC
    # GPU address -> (NIC position, (its NicChoice,)) where one NIC alone is nearest: what
    # _shared gives that GPU when it wants one NIC, whatever the use counts.
    alone: dict[str, tuple[int, tuple[NicChoice]]] = field(default_factory=dict)


def _table(topology: Topology, distances: DistanceModel) -> _Table:
    """GPU x NIC distances, kept on the DistanceModel (a new topology gets a new model),
    with what every decision would otherwise derive from them again."""
    table = distances.memo.get("nic_table")
    if table is None or distances.topology is not topology:
        nics = offered_nics(topology)
        distance = {gpu.address: tuple(distances.between(gpu.address, nic.address) for nic in nics)
                    for gpu in topology.gpus}
        tiers: dict[str, tuple[tuple[int, ...], ...]] = {}
        for address, row in distance.items():
            grouped: dict[float, list[int]] = {}
            for i in sorted(range(len(nics)), key=lambda i: (row[i].weight, i)):
                grouped.setdefault(row[i].weight, []).append(i)
            tiers[address] = tuple(tuple(group) for group in grouped.values())
        choices = {address: tuple(_choice(nic, d) for nic, d in zip(nics, row)) for address, row in distance.items()}
        table = _Table(nics, distance, tuple(nic.key for nic in nics), tiers, choices,
                       {address: min((d.weight for d in row), default=None) for address, row in distance.items()},
                       {address: (groups[0][0], (choices[address][groups[0][0]],))
                        for address, groups in tiers.items() if groups and len(groups[0]) == 1})
        if distances.topology is topology:
            distances.memo["nic_table"] = table
    return table


def _wanted(mode: str, per_gpu: int | None) -> int:
    if mode not in NIC_MODES:
        raise ValueError(f"[alloc] nics must be one of {', '.join(NIC_MODES)}, got {mode!r}")
    if mode == "none":
        if per_gpu:
            raise InvalidRequestError("nics_per_gpu", "this host hands out no NICs ([alloc] nics = \"none\")")
        return 0
    return 1 if per_gpu is None else per_gpu


def tie_break_terms(topology: Topology, distances: DistanceModel, gpus: Sequence[Gpu], mode: str,
                    per_gpu: int | None, busy: frozenset[str]) -> list[float]:
    """Per GPU, its engine objective term (0.0 for all when NICs play no part)."""
    if _wanted(mode, per_gpu) == 0:
        return [0.0] * len(gpus)
    table = _table(topology, distances)
    if not table.nics:
        return [0.0] * len(gpus)
    scale = BASE_WEIGHTS["SYS"]
    if mode == "shared" or not busy:  # every NIC usable: each GPU's nearest, kept in the table
        nearest_of = table.nearest
        return [NIC_TIE_BREAK * (NO_NIC_TERM if nearest_of.get(gpu.address) is None
                                 else nearest_of[gpu.address] / scale) for gpu in gpus]
    usable = [i for i, key in enumerate(table.keys) if key not in busy]
    out = []
    for gpu in gpus:
        row = table.distance.get(gpu.address)
        nearest = min((row[i].weight for i in usable), default=None) if row else None
        out.append(NIC_TIE_BREAK * (NO_NIC_TERM if nearest is None else nearest / scale))
    return out


def pair_nics(topology: Topology, distances: DistanceModel, gpus: Sequence[Gpu], mode: str,
              per_gpu: int | None, busy: frozenset[str] = frozenset(), use: Mapping[str, int] | None = None,
              other_free: Sequence[Gpu] = ()) -> tuple[dict[int, tuple[NicChoice, ...]], list[str]]:
    """GPU index -> its NICs (nearest first), and reasons worth telling the caller.
    `busy`: keys of NICs exclusive leases hold; `use`: key -> leases using it (shared
    tie-break); `other_free`: free GPUs outside this lease (exclusive tie-break)."""
    want = _wanted(mode, per_gpu)
    if want == 0 or not gpus:
        return {}, []
    table = _table(topology, distances)
    strict = per_gpu is not None
    if not table.nics:
        if strict:
            raise InsufficientNicsError(f"nics_per_gpu {per_gpu}: this host has no RDMA NIC with an active port",
                                        retryable=False)
        return {}, []
    if strict and want > len(table.nics):
        raise InsufficientNicsError(f"nics_per_gpu {per_gpu}: this host offers {len(table.nics)} RDMA NIC "
                                    "port(s) in all", retryable=False)
    if mode == "shared":
        out, reasons = _shared(table, gpus, want, use or {}), []
    else:
        out, reasons = _exclusive(table, gpus, want, busy, other_free, strict)
    far = {}
    for gpu, choices in out.items():
        if len(choices) == 1:  # the commonest: one NIC a GPU
            if choices[0].level not in NEAR_LEVELS:
                far[gpu] = [choices[0].level]
            continue
        levels = {c.level for c in choices if c.level not in NEAR_LEVELS}
        if levels:
            far[gpu] = sorted(levels)
    if far:
        reasons.append("RDMA NIC not under the PCIe switch of GPU " + ", ".join(
            f"{gpu} ({'/'.join(levels)})" for gpu, levels in sorted(far.items())))
    return out, reasons


def _choice(nic: Nic, distance: Distance) -> NicChoice:
    return NicChoice(nic.name, nic.address, nic.port, distance.label)


def _shared(table: _Table, gpus: Sequence[Gpu], want: int, use: Mapping[str, int]) -> dict[int, tuple[NicChoice, ...]]:
    """Per GPU the `want` NICs first by (weight, leases using it, position): the groups
    of equal weight in the table, nearest first, each ordered by use."""
    out: dict[int, tuple[NicChoice, ...]] = {}
    taken: dict[str, int] = {}  # this lease's own choices spread like other leases' do
    keys = table.keys
    every = (tuple(range(len(table.nics))),)
    alone = table.alone if want == 1 else {}
    for gpu in gpus:
        one = alone.get(gpu.address)
        if one is not None:  # its nearest NIC, alone in its tier: no use count can reorder it
            key = keys[one[0]]
            taken[key] = taken.get(key, 0) + 1
            out[gpu.index] = one[1]
            continue
        tiers = table.tiers.get(gpu.address, every)
        chosen: list[int] = []
        for group in tiers:
            if len(chosen) >= want:
                break
            if len(group) > 1 and (use or taken):
                group = sorted(group, key=lambda i: (use.get(keys[i], 0) + taken.get(keys[i], 0), i))
            chosen.extend(group[:want - len(chosen)])
        for i in chosen:
            taken[keys[i]] = taken.get(keys[i], 0) + 1
        choices = table.choices.get(gpu.address)
        out[gpu.index] = tuple(choices[i] if choices else _choice(table.nics[i], Distance("SYS", 0.0)) for i in chosen)
    return out


def _exclusive(table: _Table, gpus: Sequence[Gpu], want: int, busy: frozenset[str], other_free: Sequence[Gpu],
               strict: bool) -> tuple[dict[int, tuple[NicChoice, ...]], list[str]]:
    free = [i for i, nic in enumerate(table.nics) if nic.key not in busy]
    # How much another free GPU wants a NIC: its weight to the nearest of them (low = wanted).
    wanted_by_others = {i: min((table.distance[g.address][i].weight for g in other_free
                                if g.address in table.distance), default=float("inf")) for i in free}
    if not strict:  # best effort leaves other free GPUs their own NICs
        free = [i for i in free if wanted_by_others[i] > OWN_NIC_WEIGHT]
    edges = sorted(((table.distance[gpu.address][i].weight if gpu.address in table.distance else float("inf"),
                     -wanted_by_others[i], order, i)
                    for order, gpu in enumerate(gpus) for i in free))
    given: dict[int, list[int]] = {order: [] for order in range(len(gpus))}
    used: set[int] = set()
    for _, _, order, i in edges:
        if i in used or len(given[order]) >= want:
            continue
        given[order].append(i)
        used.add(i)
    short = [gpus[order].index for order, got in given.items() if len(got) < want]
    if short and strict:
        total = len(table.nics)
        needed = want * len(gpus)
        raise InsufficientNicsError(
            f"nics_per_gpu {want} for {len(gpus)} GPU(s) needs {needed} NIC port(s); {len(free)} of the host's "
            f"{total} are free ([alloc] nics = \"exclusive\")", retryable=needed <= total)
    reasons = []
    if short:
        reasons.append(f"no free RDMA NIC for GPU {', '.join(map(str, short))} ([alloc] nics = \"exclusive\": "
                       "the others are leased or under another free GPU's switch; nics_per_gpu takes them)")
    out = {}
    for order, gpu in enumerate(gpus):
        row = table.distance.get(gpu.address)
        picks = sorted(given[order], key=lambda i: (row[i].weight if row else 0.0, i))
        out[gpu.index] = tuple(_choice(table.nics[i], row[i] if row else Distance("SYS", 0.0)) for i in picks)
    return out, reasons


def lease_nic_keys(placements: Iterable[Any]) -> set[str]:
    """Keys of the NICs a decision's placements carry (any object with .nics)."""
    return {choice.key for placement in placements for choice in getattr(placement, "nics", ())}


def _item(choice: NicChoice) -> str:
    """How NCCL_IB_HCA names a port: the device, with :port unless it is port 1."""
    return choice.name if choice.port == 1 else choice.hca


def nic_environment(placements: Sequence[Any]) -> dict[str, str]:
    """What a job reads to send through its lease's NICs (empty when the lease has none):
    NCCL_IB_HCA in NCCL's exact-match form (`=mlx5_0:1,mlx5_1:1`: a leading '=' matches
    names exactly, so mlx5_1 does not also select mlx5_10), UCX_NET_DEVICES (`dev:port`
    list), and TOPOD_GPU_NICS (`<gpu>:<nic>[,<nic>];...`, each entry as NCCL_IB_HCA names
    it) for a launcher that gives each rank its own GPU's NIC."""
    ports: list[str] = []
    for placement in placements:
        for choice in placement.nics:
            if choice.hca not in ports:
                ports.append(choice.hca)
    if not ports:
        return {}
    return {
        "NCCL_IB_HCA": "=" + ",".join(ports),
        "UCX_NET_DEVICES": ",".join(ports),
        "TOPOD_GPU_NICS": ";".join(f"{p.index}:{','.join(_item(c) for c in p.nics)}" for p in placements),
    }


def rank_nic_environment(gpu_nics: str, gpu: str) -> dict[str, str]:
    """NCCL_IB_HCA and UCX_NET_DEVICES narrowed to one GPU's own NICs, from a lease's
    TOPOD_GPU_NICS (`0:mlx5_0;1:mlx5_1,mlx5_10:2`); empty when that GPU has none listed."""
    entries = dict(item.split(":", 1) for item in gpu_nics.split(";") if ":" in item)
    items = [item for item in entries.get(gpu, "").split(",") if item]
    if not items:
        return {}
    ports = [item if ":" in item else f"{item}:1" for item in items]
    return {"NCCL_IB_HCA": "=" + ",".join(ports), "UCX_NET_DEVICES": ",".join(ports)}
