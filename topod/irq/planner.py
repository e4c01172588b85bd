"""The IRQ plan: a pure function of the Topology, the IRQs' classes and current
affinity, the measured load, the leased CPUs and the policy. No I/O.

Per class the policy is 'spread' (one CPU per IRQ, one IRQ per physical core before any
hyper-thread sibling, queues in core order, the node's devices sharing its cores evenly),
'pin-node' (the IRQ may go to any eligible CPU near its device; the kernel picks) or
'leave' (not touched). Spreading is sticky: an IRQ already alone enough on an eligible
CPU stays there, so a lease or a restart moves only what it must.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Mapping

from topod.cpulist import format_cpulist, parse_cpulist
from topod.irq.classify import IrqInfo
from topod.irq.refine import Weights, background_load, delivered_cpu, imbalance, refine
from topod.model import Cpu, PciDevice, Topology

from topod.irq.settings import ENOSPC_ALTERNATIVES, POLICIES, IrqSettings
from topod.record import field, record


_PLAN_ENTRY_FIELDS = (
    "irq",  # int
    "name",  # str | None
    "device",  # str | None: its PCI address
    "irq_class",  # str
    "policy",  # str
    "current",  # tuple[int, ...] | None: smp_affinity_list now
    "planned",  # tuple[int, ...] | None: None, leave as it is
    "managed",  # bool
    "reason",  # str
    "alternatives",  # tuple[int, ...]: CPUs to try in turn when the kernel answers ENOSPC
    "effective",  # tuple[int, ...] | None
)


class PlanEntry(namedtuple("PlanEntry", _PLAN_ENTRY_FIELDS, defaults=((), None))):
    """One IRQ's plan. A named tuple rather than a frozen dataclass: the planner makes one
    per IRQ (4,096 on a big host) and a frozen dataclass costs ~5x more to build; from
    collections, not typing.NamedTuple, so the IRQ worker never imports typing (~0.5 MiB)."""

    __slots__ = ()

    @property
    def changes(self) -> bool:
        return self.planned is not None and self.planned != self.current

    def to_json(self) -> dict[str, object]:
        return {"irq": self.irq, "name": self.name, "device": self.device, "class": self.irq_class,
                "policy": self.policy, "current": _cpus_json(self.current), "planned": _cpus_json(self.planned),
                "effective": _cpus_json(self.effective), "managed": self.managed, "reason": self.reason}


def _cpus_json(cpus: tuple[int, ...] | None) -> list[int] | None:
    return None if cpus is None else list(cpus)


@record
class Plan:
    entries: tuple[PlanEntry, ...]
    notes: tuple[str, ...] = ()
    imbalance_before: float | None = None  # max/mean load over the spread CPUs; None without rates
    imbalance_after: float | None = None
    background: Mapping[int, float] = field(default_factory=dict)  # cpu -> load of the IRQs not spread

    def entry(self, irq: int) -> PlanEntry | None:
        for entry in self.entries:
            if entry.irq == irq:
                return entry
        return None

    @property
    def changes(self) -> tuple[PlanEntry, ...]:
        return tuple(e for e in self.entries if e.changes)


@record
class PlanInput:
    """Everything the planner looks at besides the topology and settings."""

    irqs: Mapping[int, IrqInfo]
    current: Mapping[int, tuple[int, ...] | None]  # requested affinity per IRQ
    effective: Mapping[int, tuple[int, ...] | None] = field(default_factory=dict)
    leased_cpus: frozenset[int] = frozenset()
    weights: Weights | None = None  # irq -> load weight; None on cycles without rates
    unsettable: Mapping[int, str] = field(default_factory=dict)  # irq -> why the kernel refuses
    cooling: frozenset[int] = frozenset()  # IRQs moved too recently for a load move
    # cpu -> load of the IRQs not spread, when irqs is a subset of the host's IRQs (a re-plan
    # after a lease change): the full plan's figure, as the subset cannot compute it.
    background: Mapping[int, float] | None = None


@record
class _Pool:
    order: tuple[int, ...]  # eligible CPUs, physical cores first, then siblings, each in core order
    reason: str
    position: Mapping[int, int] = field(default_factory=dict)
    ring: tuple[int, ...] = ()  # order twice: the CPUs after any one are a slice


def _pool(order: tuple[int, ...], reason: str) -> _Pool:
    return _Pool(order, reason, {cpu: i for i, cpu in enumerate(order)}, order + order)


def plan_irqs(topology: Topology, inputs: PlanInput, settings: IrqSettings) -> Plan:
    cpus = {cpu.id: cpu for cpu in topology.cpus if cpu.online}
    devices = {device.address: device for device in topology.pci_devices}
    excluded = _excluded(topology, inputs.leased_cpus, settings)
    pools: dict[str | None, _Pool | None] = {}
    by_cpus: dict[tuple[int, ...], _Pool | None] = {}  # devices with the same near CPUs share one pool
    shared: dict[tuple[str | None, str], tuple] = {}  # (device, class) -> decision, when no IRQ override applies
    decided: dict[int, tuple[str, tuple[int, ...] | None, str, _Pool | None]] = {}
    for irq in sorted(inputs.irqs):
        info = inputs.irqs[irq]
        device = devices.get(info.device) if info.device else None
        if info.device not in pools:
            pools[info.device] = _device_pool(topology, device, cpus, excluded, settings, by_cpus)
        if irq in inputs.unsettable or _irq_override(info, settings) is not None:
            decided[irq] = _decide(info, device, pools[info.device], cpus, inputs, settings)
            continue
        key = (info.device, info.irq_class)
        if key not in shared:
            shared[key] = _decide(info, device, pools[info.device], cpus, inputs, settings)
        decided[irq] = shared[key]
    spread, groups = _spread(inputs, decided)
    notes: list[str] = []
    before = after = None
    background: Mapping[int, float] = {}
    if inputs.weights is not None:
        background = inputs.background
        if background is None:
            not_spread = {irq for irq, d in decided.items() if d[0] != "spread" or irq in inputs.unsettable}
            background = background_load(not_spread, inputs.weights, inputs.effective, inputs.current)
    if inputs.weights is not None and spread:
        before = imbalance(delivered_cpu(spread, inputs.effective, inputs.current), inputs.weights, background, groups)
        spread, moved = refine(spread, groups, inputs.weights, background, inputs.cooling, settings.min_gain)
        after = imbalance(spread, inputs.weights, background, groups)
        for irq, why in moved.items():
            policy, _, reason, pool = decided[irq]
            decided[irq] = (policy, None, f"{reason}; {why}", pool)
    entries = []
    for irq, (policy, planned, reason, pool) in decided.items():
        info = inputs.irqs[irq]
        if irq in spread and planned is None:
            planned = (spread[irq],)
        current = inputs.current.get(irq)
        alternatives = _alternatives(pool, planned) if policy == "spread" and planned and planned != current else ()
        entries.append(PlanEntry(irq, info.name, info.device, info.irq_class, policy, current,
                                 planned, irq in inputs.unsettable, reason, alternatives, inputs.effective.get(irq)))
    if inputs.weights is None:
        notes.append("no rates this cycle: placement by IRQ count only")
    return Plan(tuple(entries), tuple(notes), before, after, background)


class DevicePool(namedtuple("DevicePool", ("order", "watch"))):
    """order: the CPUs its IRQs may take, in spreading order (None: none); watch: the CPUs
    whose leasing can change order (None: any CPU)."""

    __slots__ = ()


def device_pools(topology: Topology, addresses: Iterable[str], leased: frozenset[int],
                 settings: IrqSettings) -> dict[str, DevicePool]:
    """Each device's spreading pool with these leases (devices with the same order share
    one spread group), and which CPUs it depends on: its near CPUs while the pool is drawn
    from them, every CPU when it fell back to another node or has no pool at all."""
    cpus = {cpu.id: cpu for cpu in topology.cpus if cpu.online}
    by_address = {device.address: device for device in topology.pci_devices}
    excluded = _excluded(topology, leased, settings)
    cache: dict[tuple[int, ...], _Pool | None] = {}
    out: dict[str, DevicePool] = {}
    for address in addresses:
        device = by_address.get(address)
        pool = _device_pool(topology, device, cpus, excluded, settings, cache)
        near = frozenset(_near_cpus(topology, device, cpus)[0]) if device is not None else frozenset()
        order = None if pool is None else pool.order
        own = bool(near) and order is not None and near.issuperset(order)
        out[address] = DevicePool(order, near if own or device is None else None)
    return out


def _excluded(topology: Topology, leased: frozenset[int], settings: IrqSettings) -> frozenset[int]:
    """CPUs no device IRQ may go to in the normal case. Housekeeping CPUs are kept for the
    OS while free cores exist; they take device IRQs only when leases hold every near CPU."""
    return frozenset(topology.isolated_cpus) | frozenset(topology.nohz_full_cpus) | settings.banned_cpus \
        | leased | settings.housekeeping_cpus


def _near_cpus(topology: Topology, device: PciDevice, cpus: Mapping[int, Cpu]) -> tuple[list[int], int | None]:
    local = [c for c in device.local_cpus if c in cpus]
    node = topology.node(device.numa_node) if device.numa_node is not None else None
    if not local and node is not None:
        local = [c for c in (node.cpus or node.local_cpus) if c in cpus]
    return local, device.numa_node


def _device_pool(topology: Topology, device: PciDevice | None, cpus: Mapping[int, Cpu],
                 excluded: frozenset[int], settings: IrqSettings,
                 cache: dict[tuple[int, ...], _Pool | None]) -> _Pool | None:
    if device is None:
        return None
    near, node = _near_cpus(topology, device, cpus)
    key = (node if node is not None else -1, *near)
    if key not in cache:
        cache[key] = _pool_for(topology, near, node, cpus, excluded, settings)
    return cache[key]


def _pool_for(topology: Topology, near: list[int], node: int | None, cpus: Mapping[int, Cpu],
              excluded: frozenset[int], settings: IrqSettings) -> _Pool | None:
    if not near:
        eligible = [c for c in cpus if c not in excluded]
        return _pool(_core_order(eligible, cpus), "device's NUMA node unknown: all eligible CPUs") if eligible else None
    eligible = [c for c in near if c not in excluded]
    if eligible:
        return _pool(_core_order(eligible, cpus), f"spread over node {node}'s eligible CPUs")
    blocked = frozenset(topology.isolated_cpus) | frozenset(topology.nohz_full_cpus) | settings.banned_cpus
    housekeeping = [c for c in near if c in settings.housekeeping_cpus and c not in blocked]
    if housekeeping:
        return _pool(_core_order(housekeeping, cpus),
                     f"leases hold all CPUs near the device: using node {node}'s housekeeping CPUs")
    for other, distance in _nodes_by_distance(topology, node):
        node_cpus = [c for c in topology.node(other).cpus if c in cpus]  # type: ignore[union-attr]
        candidates = [c for c in node_cpus if c not in excluded] or \
                     [c for c in node_cpus if c in settings.housekeeping_cpus and c not in blocked]
        if candidates:
            return _pool(_core_order(candidates, cpus),
                         f"no eligible CPU on node {node} (leased, isolated or banned): "
                         f"using nearest node {other} (SLIT distance {distance})")
    return None


def _nodes_by_distance(topology: Topology, node: int | None) -> list[tuple[int, int]]:
    row = topology.node(node).distances if node is not None and topology.node(node) else {}
    others = [(row.get(n.id, 255), n.id) for n in topology.numa_nodes if n.id != node and n.cpus]
    return [(nid, distance) for distance, nid in sorted(others)]


def _core_order(eligible: list[int], cpus: Mapping[int, Cpu]) -> tuple[int, ...]:
    """Physical cores first, then hyper-thread siblings, then threads whose sibling is busy
    or excluded; within each pass, core order."""
    chosen = set(eligible)

    def key(cpu_id: int) -> tuple[int, int, int]:
        siblings = cpus[cpu_id].physical_core
        free = [s for s in siblings if s in chosen]
        # A thread whose sibling runs a job (or is excluded) comes after every free sibling.
        rank = free.index(cpu_id) + (len(siblings) if len(free) < len(siblings) else 0)
        return (rank, min(siblings), cpu_id)

    return tuple(sorted(chosen, key=key))


def _decide(info: IrqInfo, device: PciDevice | None, pool: _Pool | None, cpus: Mapping[int, Cpu],
            inputs: PlanInput, settings: IrqSettings) -> tuple[str, tuple[int, ...] | None, str, _Pool | None]:
    """(policy, planned or None, reason, pool) for one IRQ; spread IRQs get their CPU later."""
    if info.irq in inputs.unsettable:
        return "leave", None, inputs.unsettable[info.irq], None
    policy, origin = _policy_for(info, device, settings)
    if policy not in POLICIES:
        wanted = tuple(c for c in parse_cpulist(policy) if c in cpus)
        if not wanted:
            return "leave", None, f"{origin} {policy!r} names no online CPU; left as is", None
        return "explicit", wanted, f"{origin} pins it to {format_cpulist(wanted)}", None
    if policy == "leave":
        return "leave", None, f"{origin}: leave", None
    if device is None:
        return "leave", None, "no PCI device found for this IRQ; left as is", None
    if pool is None:
        return "leave", None, "no eligible CPU on any node (all leased, isolated or banned); left as is", None
    if policy == "pin-node":
        return policy, tuple(sorted(pool.order)), f"{origin}: pin-node, {pool.reason}", pool
    return policy, None, f"{origin}: spread, {pool.reason}", pool


def _irq_override(info: IrqInfo, settings: IrqSettings) -> tuple[str, str] | None:
    if not settings.irq_overrides:
        return None
    for key in (str(info.irq), info.name):
        if key is not None and key in settings.irq_overrides:
            return settings.irq_overrides[key], f"IRQ override {key!r}"
    return None


def _policy_for(info: IrqInfo, device: PciDevice | None, settings: IrqSettings) -> tuple[str, str]:
    override = _irq_override(info, settings)
    if override is not None:
        return override
    if device is not None:
        for key in (device.address, *device.names):
            if key in settings.device_overrides:
                return settings.device_overrides[key], f"device override {key!r}"
    return settings.policy.get(info.irq_class, "leave"), f"class {info.irq_class}"


def _spread(inputs: PlanInput, decided: Mapping[int, tuple]) -> tuple[dict[int, int], dict[tuple[int, ...], list[int]]]:
    """Balance every pool's spread IRQs: (irq -> cpu, pool order -> its IRQs)."""
    by_pool: dict[int, tuple[_Pool, list[IrqInfo]]] = {}
    for irq, (policy, _, _, pool) in decided.items():
        if policy == "spread" and pool is not None:
            by_pool.setdefault(id(pool), (pool, []))[1].append(inputs.irqs[irq])
    # Same CPU set, same pool: the node's devices share its cores.
    merged: dict[tuple[int, ...], list[IrqInfo]] = {}
    for pool, infos in by_pool.values():
        merged.setdefault(pool.order, []).extend(infos)
    placed: dict[int, int] = {}
    groups: dict[tuple[int, ...], list[int]] = {}
    for order, infos in merged.items():
        infos.sort(key=lambda i: (i.device or "", *i.sort_key))
        previous = {i.irq: cur[0] for i in infos if (cur := inputs.current.get(i.irq)) and len(cur) == 1}
        groups[order] = [i.irq for i in infos]
        placed.update(balance(order, groups[order], previous))
    return placed, groups


def balance(order: tuple[int, ...], irqs: list[int], previous: Mapping[int, int]) -> dict[int, int]:
    """irq -> cpu with per-CPU counts differing by at most one, keeping each IRQ where it
    is when that fits, filling the rest round-robin in core order."""
    m, n = len(order), len(irqs)
    lo, extra = divmod(n, m)
    kept: dict[int, list[int]] = {cpu: [] for cpu in order}
    rank = {irq: i for i, irq in enumerate(irqs)}
    loose: list[int] = []
    for irq in irqs:
        cpu = previous.get(irq)
        (kept[cpu] if cpu in kept else loose).append(irq)
    ceiling = lo + (1 if extra else 0)
    for cpu in order:  # a crowded CPU (an IRQ storm) keeps none: the storm is laid out afresh in core order
        if len(kept[cpu]) > ceiling:
            loose.extend(kept[cpu])
            kept[cpu] = []
    quota = dict.fromkeys(order, lo)
    for cpu in order:  # the hi slots go first to CPUs already holding more than lo: fewer moves
        if extra and len(kept[cpu]) > lo:
            quota[cpu], extra = lo + 1, extra - 1
    for cpu in order:
        if extra and quota[cpu] == lo:
            quota[cpu], extra = lo + 1, extra - 1
    placed: dict[int, int] = {}
    for cpu in order:
        for irq in kept[cpu][: quota[cpu]]:
            placed[irq] = cpu
        loose.extend(kept[cpu][quota[cpu]:])
    loose.sort(key=rank.__getitem__)
    counts = {cpu: min(len(kept[cpu]), quota[cpu]) for cpu in order}
    level, index = min(counts.values(), default=0), 0
    while index < len(loose):  # round r gives one IRQ to each CPU still at count r
        for cpu in order:
            if index < len(loose) and counts[cpu] <= level < quota[cpu]:
                placed[loose[index]] = cpu
                counts[cpu] += 1
                index += 1
        level += 1
    return placed


def _alternatives(pool: _Pool | None, planned: tuple[int, ...]) -> tuple[int, ...]:
    start = pool.position.get(planned[0]) if pool is not None and len(planned) == 1 else None
    if start is None:
        return ()
    count = min(ENOSPC_ALTERNATIVES, len(pool.order) - 1)  # type: ignore[union-attr]
    return pool.ring[start + 1:start + 1 + count]  # type: ignore[union-attr]
