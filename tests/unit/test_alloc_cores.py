"""CPUs for chosen GPUs: whole cores on the GPU's node, never isolated, nohz_full,
reserved or leased CPUs, contiguous and L3-sharing, with the 'any' fallback marked."""

from __future__ import annotations

import pytest

from topod.alloc.cores import assign_cpus
from topod.alloc.engine import allocate
from topod.alloc.errors import InsufficientCpusError
from topod.alloc.request import FreeState, Request
from topod.discover import discover
from topod.distance import DistanceModel
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.record import replace


@pytest.fixture(scope="module")
def h800(tmp_path_factory):
    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path_factory.mktemp("h800"))
    topology = discover(HostRoot(root), live_nvml=False)
    return topology, DistanceModel(topology)


@pytest.fixture(scope="module")
def h800_isolated(tmp_path_factory):
    spec = load_builtin_spec("h800-8gpu")
    spec["cpu"] = {**spec["cpu"], "isolated": "0-3", "nohz_full": "4-5"}
    root = build_host(spec, tmp_path_factory.mktemp("h800-isolated"))
    topology = discover(HostRoot(root), live_nvml=False)
    return topology, DistanceModel(topology)


def _core(cpu: int) -> int:
    return cpu % 32  # h800 fixture: 32 cores, CPU c and c+32 are hyper-thread siblings


def test_each_gpu_gets_whole_cores_on_its_own_node(h800):
    topology, distances = h800
    decision = allocate(topology, distances, FreeState(), Request(gpus=8, cpus_per_gpu=4, level="any"))
    seen: set[int] = set()
    for gpu, cpus in decision.cpus.items():
        assert len(cpus) == 4
        node = topology.gpu(gpu).numa_node
        assert {topology.cpu(c).numa_node for c in cpus} == {node}
        for cpu in cpus:
            assert set(topology.cpu(cpu).siblings) <= set(cpus), "both hyper-threads of a core together"
        assert not seen & set(cpus)
        seen |= set(cpus)
    assert not decision.cpu_fallback


def test_odd_cpu_count_is_rounded_up_to_whole_cores_and_said(h800):
    topology, distances = h800
    decision = allocate(topology, distances, FreeState(), Request(gpus=1, cpus_per_gpu=3))
    (cpus,) = decision.cpus.values()
    assert len(cpus) == 4
    assert any("rounded up" in reason for reason in decision.reasons)


def test_isolated_and_nohz_full_cores_are_never_used(h800_isolated):
    topology, distances = h800_isolated
    decision = allocate(topology, distances, FreeState(), Request(gpus=4, cpus_per_gpu=4, level="good"))
    used = {c for cpus in decision.cpus.values() for c in cpus}
    assert not used & {0, 1, 2, 3, 4, 5, 32, 33, 34, 35, 36, 37}, "a core with an isolated thread is skipped whole"


def test_reserved_and_leased_cpus_are_skipped(h800):
    topology, distances = h800
    state = FreeState(busy_cpus=frozenset({2}), reserved_cpus=frozenset({0, 33}))
    decision = allocate(topology, distances, state, Request(gpus=2, cpus_per_gpu=2, level="good"))
    used = {c for cpus in decision.cpus.values() for c in cpus}
    assert not used & {0, 32, 1, 33, 2, 34}


def test_each_gpus_cores_are_contiguous(h800):
    topology, distances = h800
    state = FreeState(busy_cpus=frozenset({3}))  # core 3 taken: cores 0-2 hold one 4-CPU block only
    decision = allocate(topology, distances, state, Request(gpus=2, cpus_per_gpu=4, level="good"))
    blocks = sorted(sorted({_core(c) for c in cpus}) for cpus in decision.cpus.values())
    assert blocks == [[0, 1], [4, 5]]


def test_cores_prefer_one_l3_over_the_first_window(h800):
    topology, _ = h800
    # Split node 0 into two L3 domains: cores 0-7 and 8-15.
    cpus = tuple(replace(c, llc=0 if _core(c.id) < 8 else 8) if c.numa_node == 0 else c for c in topology.cpus)
    split = replace(topology, cpus=cpus)
    busy = {1, 5, 33, 37}  # cores 1 and 5: the first 4-core window is 6-9, across both L3s
    choice = assign_cpus(split, [split.gpu(0)], 8, busy, allow_fallback=False)
    assert sorted({_core(c) for c in choice.cpus[0]}) == [8, 9, 10, 11]


def test_too_few_near_cores_fail_at_good_and_fall_back_at_any(h800):
    topology, distances = h800
    node0 = [c.id for c in topology.cpus if c.numa_node == 0]
    busy = frozenset(node0[2:])  # node 0 keeps one free core (2 CPUs)
    request = dict(gpus=1, must_include=(0,), cpus_per_gpu=4)
    with pytest.raises(InsufficientCpusError) as error:
        allocate(topology, distances, FreeState(busy_cpus=busy), Request(level="good", **request))
    assert error.value.code == "insufficient_cpus"
    decision = allocate(topology, distances, FreeState(busy_cpus=busy), Request(level="any", **request))
    assert decision.cpu_fallback
    assert {topology.cpu(c).numa_node for c in decision.cpus[0]} == {1}
    assert decision.placements[0].cpu_node == 1 and decision.memory_nodes == (0,)
    assert any("fallback" in reason for reason in decision.reasons)


def test_search_avoids_gpus_whose_node_has_no_free_cores(h800):
    topology, distances = h800
    busy = frozenset(c.id for c in topology.cpus if c.numa_node == 0)
    decision = allocate(topology, distances, FreeState(busy_cpus=busy), Request(gpus=2, cpus_per_gpu=2))
    assert {topology.gpu(g).numa_node for g in decision.gpus} == {1}


def test_zero_cpus_per_gpu_gives_no_cpus(h800):
    topology, distances = h800
    decision = allocate(topology, distances, FreeState(), Request(gpus=2))
    assert all(cpus == () for cpus in decision.cpus.values())


def test_auto_gives_each_gpu_its_nodes_fair_share_of_whole_cores(h800):
    topology, distances = h800
    decision = allocate(topology, distances, FreeState(), Request(gpus=4, level="good", cpus_per_gpu="auto"))
    # 16 cores per node, one left to the system, 4 GPUs per node: 3 cores = 6 CPUs each
    assert {gpu: len(cpus) for gpu, cpus in decision.cpus.items()} == {g: 6 for g in decision.gpus}
    node_of = {cpu.id: cpu.numa_node for cpu in topology.cpus}
    gpu_node = {gpu.index: gpu.numa_node for gpu in topology.gpus}
    assert all(node_of[c] == gpu_node[g] for g, cpus in decision.cpus.items() for c in cpus)
    assert any("auto" in reason for reason in decision.reasons)


def test_auto_share_leaves_reserved_cpus_out_and_does_not_shrink_with_leases(h800):
    from topod.alloc.cores import fair_share

    topology, _ = h800
    node0 = sorted(topology.numa_nodes[0].cpus)
    reserved = {c for c in node0 if _core(c) < 4}  # four whole cores of node 0
    assert fair_share(topology, set()) == {0: 6, 1: 6}
    assert fair_share(topology, reserved) == {0: 4, 1: 6}, "(12 - 1) // 4 = 2 cores on node 0"


def test_auto_on_a_full_node_is_insufficient_cpus_not_a_silent_unpinned_lease(h800):
    topology, distances = h800
    node0 = set(topology.numa_nodes[0].cpus)
    busy = frozenset(sorted(node0)[:-4])  # leave two cores: less than one GPU's share
    with pytest.raises(InsufficientCpusError):
        allocate(topology, distances, FreeState(busy_cpus=busy, busy_gpus=frozenset(range(4, 8))),
                 Request(gpus=1, level="good", cpus_per_gpu="auto"))


def test_gpu_memory_nodes_binds_each_gpus_own_memory_node_when_asked(tmp_path):
    root = build_host(load_builtin_spec("grace-hopper-2gpu"), tmp_path / "gh")
    topology = discover(HostRoot(root), live_nvml=False)
    distances = DistanceModel(topology)
    gpu = topology.gpus[0]
    assert gpu.memory_numa_node is not None and gpu.memory_numa_node != gpu.numa_node
    plain = allocate(topology, distances, FreeState(), Request(gpus=1, must_include=(gpu.index,)))
    assert plain.memory_nodes == (gpu.numa_node,)
    asked = allocate(topology, distances, FreeState(),
                     Request(gpus=1, must_include=(gpu.index,), gpu_memory_nodes=True))
    assert asked.memory_nodes == tuple(sorted({gpu.numa_node, gpu.memory_numa_node}))


def _node_cpus(topology, node: int) -> list[int]:
    return sorted(c.id for c in topology.cpus if c.numa_node == node)


@pytest.mark.parametrize("name", ["nvs-64gpu", "pcie-64gpu"])
def test_auto_never_makes_a_request_impossible_on_an_empty_host(host, name):
    """Synthetic 64-GPU hosts: 8 GPUs but 4 cores per node, so the fair share (one core)
    serves only 4 GPUs of a node. An 8-GPU request at the default level was refused for
    lack of CPUs; auto now lets the node's GPUs share its cores, and says so."""
    topology, distances = host(name)
    node_of = {c.id: c.numa_node for c in topology.cpus}
    for k in (1, 4, 8, 16, 64):
        for level in ("good", "best"):
            decision = allocate(topology, distances, FreeState(), Request(gpus=k, level=level, cpus_per_gpu="auto"))
            assert decision.level == "best", (k, level)
            assert not decision.cpu_fallback
            for gpu, cpus in decision.cpus.items():
                assert cpus and {node_of[c] for c in cpus} == {topology.gpu(gpu).numa_node}
            shared = k > 4  # more than 4 GPUs of a node
            assert any(r.startswith("warning: cpus_per_gpu auto") for r in decision.reasons) == shared, decision.reasons
            if shared:
                users: dict[tuple[int, ...], int] = {}
                for cpus in decision.cpus.values():
                    users[cpus] = users.get(cpus, 0) + 1
                assert set(users.values()) == {2}, "8 GPUs of a node share its 4 cores, two per core"


def test_auto_shares_a_nodes_few_cores_and_waits_for_those_other_leases_hold(h800):
    topology, distances = h800
    node0 = _node_cpus(topology, 0)
    free_cores = {c for c in node0 if _core(c) < 2}  # two whole cores of node 0 usable
    reserved = frozenset(set(node0) - free_cores)
    request = Request(gpus=4, must_include=(0,), level="good", cpus_per_gpu="auto")
    decision = allocate(topology, distances, FreeState(reserved_cpus=reserved), request)
    assert {topology.gpu(g).numa_node for g in decision.gpus} == {0}
    assert set().union(*decision.cpus.values()) == free_cores
    assert all(len(cpus) == 2 for cpus in decision.cpus.values()), "one whole core each, shared by two GPUs"
    assert any("warning" in r and "share" in r for r in decision.reasons)
    # A lease holding one of those two cores: the request waits, as for a full share.
    held = frozenset(c for c in free_cores if _core(c) == 0)
    with pytest.raises(InsufficientCpusError):
        allocate(topology, distances, FreeState(reserved_cpus=reserved, busy_cpus=held), request)


def test_auto_takes_the_nearest_nodes_cores_for_a_gpu_whose_node_has_none(h800):
    topology, distances = h800
    reserved = frozenset(_node_cpus(topology, 0))
    decision = allocate(topology, distances, FreeState(reserved_cpus=reserved),
                        Request(gpus=1, must_include=(0,), level="good", cpus_per_gpu="auto"))
    assert decision.gpus == (0,) and decision.cpu_fallback
    assert {topology.cpu(c).numa_node for c in decision.cpus[0]} == {1} and len(decision.cpus[0]) == 2
    assert any(r.startswith("warning: cpus_per_gpu auto: node 0 has no usable") for r in decision.reasons)


def test_auto_at_level_any_takes_the_best_gpus_not_a_worse_set_with_more_cores(host):
    """auto's constraint is what the empty host's cores allow, so at level 'any' 8 GPUs on
    a 64-GPU host are one node's (sharing its cores), not two half nodes at 55x the cost."""
    topology, distances = host("nvs-64gpu")
    decision = allocate(topology, distances, FreeState(), Request(gpus=8, level="any", cpus_per_gpu="auto"))
    assert decision.level == "best" and decision.cost == pytest.approx(decision.best_cost)


def test_prepare_computes_every_default_sizes_reference_before_the_first_decision(host):
    from topod.alloc.engine import prepare

    topology, distances = host("pcie-16gpu")
    view = prepare(topology, distances)
    for k in range(1, 17):
        cost, members = view.cache[("ref", k, None, ())]
        assert len(members) == k
        assert allocate(topology, distances, FreeState(), Request(gpus=k, level="any")).best_cost == cost
