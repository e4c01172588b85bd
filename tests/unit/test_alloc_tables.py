"""The allocator's precomputed tables give what the computations they replace give:
core windows (windows._windows) and cores as bits (cores.node_cores), the lone nearest
NIC (nics._Table.alone), on several built-in hosts and random free states; the
hand-written __init__ of its hot value classes (slotinit.slot_init) builds what the
dataclass's own would."""

from __future__ import annotations

import dataclasses
import random

import pytest

from topod.alloc.cores import CoreChoice, core_map, node_cores
from topod.alloc.nics import NicChoice, _shared, _table
from topod.alloc.request import Decision, Performance, Placement
from topod.alloc.search import SearchResult
from topod.alloc.slotinit import slot_init
from topod.alloc.windows import NOWHERE
from topod.alloc.windows import pick_cores as _pick

HOSTS = ("h800-8gpu", "pcie-8gpu", "nps4-8gpu", "dgx1-cubemesh", "pcie-64gpu")


def _scan(ordered, usable, llc, taken, need, local):
    """The window a scan of the free cores in order finds (windows.pick_cores before its tables):
    the first single-L3 window inside `local`, else the best by (L3s > 1, outside, start)."""
    best = None
    n, start = len(ordered), 0
    while start < n:
        core = ordered[start]
        if core not in usable or core in taken:
            start += 1
            continue
        have, end = 0, start
        while end < n:
            core = ordered[end]
            if core not in usable or core in taken:
                break
            have += len(core)
            end += 1
            if have >= need:
                break
        if have < need:
            start = end + 1
            continue
        window = ordered[start:end]
        outside = bool(local) and any(c not in local for core in window for c in core)
        score = (len({llc[core] for core in window}) > 1, outside, start)
        if best is None or score < best[0]:
            best = (score, window)
        start += 1
    return best[1] if best else None


def _usable(cmap, node, excluded):
    ordered, _, eligible = cmap.nodes[node]
    return {core for core in ordered if core in eligible and not any(c in excluded for c in core)}


@pytest.mark.parametrize("name", HOSTS)
def test_node_cores_bits_are_the_eligible_cores_no_excluded_cpu_touches(host, name):
    topology, _ = host(name)
    cmap = core_map(topology)
    cpus = [cpu.id for cpu in topology.cpus]
    rng = random.Random(name)
    for _ in range(60):
        excluded = set(rng.sample(cpus, rng.randrange(len(cpus) // 2 + 1)))
        for _ in range(2):  # computed, then from the map's memo
            now = node_cores(topology, excluded, cmap)
            assert set(now) == set(cmap.nodes)
            for node, cores in now.items():
                got = {core for i, core in enumerate(cores.all_cores) if cores.free >> i & 1}
                assert got == _usable(cmap, node, excluded)


@pytest.mark.parametrize("name", HOSTS)
def test_window_tables_pick_what_the_scan_of_free_cores_picks(host, name):
    topology, _ = host(name)
    cmap = core_map(topology)
    cpus = [cpu.id for cpu in topology.cpus]
    locals_ = [NOWHERE, *{cmap.local[gpu.address] for gpu in topology.gpus}]
    rng = random.Random(name)
    for _ in range(150):
        excluded = set(rng.sample(cpus, rng.randrange(len(cpus) // 2 + 1)))
        now = node_cores(topology, excluded, cmap)
        for node, cores in now.items():
            ordered, llc, _ = cmap.nodes[node]
            usable = _usable(cmap, node, excluded)
            taken_cores = set(rng.sample(sorted(usable), rng.randrange(len(usable) + 1)))
            taken = {node: sum(1 << i for i, core in enumerate(ordered) if core in taken_cores)}
            need = rng.randrange(1, 13)
            local = rng.choice(locals_)
            window = _scan(ordered, usable, llc, taken_cores, need, local)
            picked = _pick(cmap, cores, taken, need, local, [], 0)
            if window is not None:
                assert picked is not None
                assert picked[0] == tuple(sorted(c for core in window for c in core))
                assert dict(picked[1]) == {node: sum(1 << ordered.index(core) for core in window)}
            elif picked is not None:  # no contiguous window: free cores, fullest L3 first
                assert set(picked[0]) <= {c for core in usable - taken_cores for c in core}
                assert len(picked[0]) >= need


@pytest.mark.parametrize("name", HOSTS)
def test_lone_nearest_nic_is_what_the_tiers_give(host, name):
    topology, distances = host(name)
    table = _table(topology, distances)
    if not table.nics:
        pytest.skip("no RDMA NIC on this host")
    plain = dataclasses.replace(table, alone={})
    rng = random.Random(name)
    gpus = list(topology.gpus)
    for _ in range(200):
        chosen = sorted(rng.sample(gpus, rng.randrange(1, min(8, len(gpus)) + 1)), key=lambda g: g.index)
        use = {key: rng.randrange(1, 4) for key in rng.sample(table.keys, rng.randrange(len(table.keys) + 1))}
        for want in (1, 2):
            assert _shared(table, chosen, want, use) == _shared(plain, chosen, want, use)


def _by_setattr(cls, values):
    """What a frozen dataclass's generated __init__ does: each field through object.__setattr__."""
    obj = object.__new__(cls)
    for name, value in zip(cls.__dataclass_fields__, values):
        object.__setattr__(obj, name, value)
    return obj


def test_slot_inits_build_what_the_dataclass_init_builds():
    nic = NicChoice("mlx5_0", "0000:19:00.0", 1, "PIX")
    placement = Placement(3, "0000:18:00.0", 0, (4, 36), 0, (nic,))
    performance = Performance(0.5, "SYS", 12.0, {"best": 1.0})
    cases = [
        (Placement, (3, "0000:18:00.0", 0, (4, 36), 0, (nic,)), {}),
        (Placement, (3, "0000:18:00.0", 0, (4, 36), 0), {"nics": ()}),
        (Performance, (0.5, "SYS", 12.0, {"best": 1.0}), {}),
        (SearchResult, ((1, 2), 1.5, True, 7), {}),
        (CoreChoice, ({3: (4, 36)}, {3: 0}, False, ("why",)), {}),
        (Decision, ((3,), (placement,), {3: (4, 36)}, (0,), (0,), 0.0, 0.0, "best", "good", 1.0, performance, True,
                    False, ("why",)), {"cpu_only": (), "near": None}),
        (Decision, ((3,), (placement,), {3: (4, 36)}, (0,), (0,), 0.0, 0.0, "best", "good", 1.0, performance, True,
                    False), {"reasons": (), "cpu_only": (), "near": None}),
    ]
    for cls, args, defaults in cases:
        built = cls(*args)
        expected = _by_setattr(cls, args + tuple(defaults.values()))
        assert built == expected and repr(built) == repr(expected)
        assert cls(**dict(zip(cls.__dataclass_fields__, args))) == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        placement.index = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing"):
        Placement(3)  # type: ignore[call-arg]


def test_slot_init_refuses_an_init_that_is_not_the_fields():
    def wrong_order(self, address, index, numa_node, cpus, cpu_node, nics=()):  # noqa: ANN001
        raise AssertionError

    def wrong_default(self, index, address, numa_node, cpus, cpu_node, nics=None):  # noqa: ANN001
        raise AssertionError

    for init in (wrong_order, wrong_default):
        with pytest.raises(TypeError, match="fields"):
            slot_init(Placement, init)


def test_slot_init_refuses_a_class_whose_post_init_it_would_skip():
    from topod.alloc.service_request import RequestLimits

    def init(self, max_wait_seconds=3600.0, max_ttl_seconds=7 * 24 * 3600.0, pid_max=RequestLimits().pid_max):  # noqa: ANN001
        raise AssertionError

    with pytest.raises(TypeError, match="__post_init__"):
        slot_init(RequestLimits, init)
    assert RequestLimits.__init__ is not init  # left as it was


def test_whole_node_is_what_solve_ties_gives_for_a_node_with_exactly_k_free():
    from topod.alloc.search import Problem
    from topod.alloc.ties import _whole_node, solve_ties

    rng = random.Random(26)
    for _ in range(300):
        m = rng.randrange(2, 8)
        members, start = [], 0
        for _ in range(m):
            size = rng.randrange(1, 4)
            members.append(list(range(start, start + size)))
            start += size
        inter = [[0.0] * m for _ in range(m)]
        for a in range(m):
            for b in range(a + 1, m):
                inter[a][b] = inter[b][a] = rng.choice([0.5, 1.1111111111111112, 1.1111211111111112, 2.0]) + rng.random()
        node = [rng.randrange(2) for _ in range(m)]
        problem = Problem(members=members, lo=[0] * m, unary=[rng.random() * 1e-7 for _ in range(m)],
                          intra=[rng.choice([0.0, 0.3333333333333333, 1.1111111111111112]) for _ in range(m)],
                          inter=inter, node=node, node_cap=None, max_nodes=1)
        on = [c for c in range(m) if node[c] == 0]
        if not on:
            continue
        k = sum(len(members[c]) for c in on)
        sub = Problem(members=[members[c] for c in on], lo=[0] * len(on), unary=[problem.unary[c] for c in on],
                      intra=[problem.intra[c] for c in on], inter=[[inter[a][b] for b in on] for a in on],
                      node=[0] * len(on), node_cap=None, max_nodes=1)
        (only,) = solve_ties(sub, k, 1e-7)
        assert _whole_node(problem, on) == only
