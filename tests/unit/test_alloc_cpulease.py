"""Leases without GPUs in the pure engine (topod.alloc.cpulease, topod.alloc.near): CPUs
near a device or node, whole cores first, one pool with the GPU leases' CPUs, never
twice, never isolated or reserved, the 'any' fallback by NUMA distance, honest
retryability, and a host with no GPUs at all."""

from __future__ import annotations

import pytest

from topod.alloc.engine import allocate
from topod.alloc.errors import InsufficientCpusError, InsufficientGpusError
from topod.alloc.feasibility import impossibility
from topod.alloc.near import UnknownDeviceError, resolve_near
from topod.alloc.request import FreeState, Request
from topod.discover import discover
from topod.distance import DistanceModel
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec

# A two-socket guest with no GPU, one NVMe and one NIC per node (the live tier's layout).
GUEST = {"name": "guest-nogpu", "pcie_gen": 3,
         "cpu": {"sockets": 2, "cores_per_socket": 2, "threads_per_core": 1, "memory_gib_per_node": 4},
         "root_complex": [{"node": 0, "devices": ["nvme", "nic"]}, {"node": 1, "devices": ["nvme", "nic"]}]}
# Four nodes whose SLIT makes node 2, not node 1, the nearest to node 0.
FOUR_NODES = {"name": "four-nodes", "pcie_gen": 4,
              "cpu": {"sockets": 4, "cores_per_socket": 2, "threads_per_core": 2, "memory_gib_per_node": 4,
                      "distances": [[10, 32, 21, 32], [32, 10, 32, 21], [21, 32, 10, 32], [32, 21, 32, 10]]},
              "root_complex": [{"node": n, "devices": ["nvme"]} for n in range(4)]}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    cache: dict[str, tuple] = {}

    def get(name: str, spec: dict | None = None):
        if name not in cache:
            root = build_host(spec or load_builtin_spec(name), tmp_path_factory.mktemp(name))
            topology = discover(HostRoot(root), live_nvml=False)
            cache[name] = (topology, DistanceModel(topology))
        return cache[name]

    return get


def cpu_lease(hosts, name, body, state=FreeState(), spec=None):
    topology, distances = hosts(name, spec)
    return allocate(topology, distances, state, Request.from_json({"gpus": 0, **body}))


def node_of(topology, cpus):
    return {topology.cpu(c).numa_node for c in cpus}


def test_cpus_come_from_the_near_devices_node_as_whole_cores(hosts):
    topology, _ = hosts("h800-8gpu")
    decision = cpu_lease(hosts, "h800-8gpu", {"cpus": 3, "near": "nvme1"})
    cpus = decision.cpu_only
    assert len(cpus) == 4  # 3 rounded up to two whole two-thread cores
    assert node_of(topology, cpus) == {1}
    for cpu in cpus:  # both hyper-threads of every core taken
        assert set(topology.cpu(cpu).siblings) <= set(cpus)
    assert decision.gpus == () and decision.placements == () and decision.cpus == {}
    assert decision.memory_nodes == (1,) and decision.near == "nvme1" and not decision.cpu_fallback
    assert "rounded up to whole physical cores" in " ".join(decision.reasons)
    assert decision.to_json()["cpus"] == list(cpus)


@pytest.mark.parametrize("near, node", [("mlx5_0", 0), ("mlx5_6", 1), ("0000:19:00.0", 0), ("19:00.0", 0),
                                        ("node:1", 1), ("nvme1n1", 1), ("ens0f0", 1)])
def test_near_names_a_device_by_name_address_or_node(hosts, near, node):
    topology, _ = hosts("h800-8gpu")
    decision = cpu_lease(hosts, "h800-8gpu", {"cpus": 2, "near": near})
    assert node_of(topology, decision.cpu_only) == {node} and decision.memory_nodes == (node,)


def test_near_prefers_the_devices_pcie_local_cpus_within_its_node(hosts):
    topology, _ = hosts("guest-nogpu", GUEST)
    device = next(d for d in topology.pci_devices if "nvme1" in d.names)
    near = resolve_near(topology, "nvme1")
    assert near.local_cpus == frozenset(device.local_cpus) and near.node == device.numa_node == 1


def test_a_near_naming_nothing_is_refused_naming_what_exists(hosts):
    with pytest.raises(UnknownDeviceError) as error:
        cpu_lease(hosts, "h800-8gpu", {"cpus": 2, "near": "nvme9"})
    assert error.value.code == "unknown_device" and error.value.retryable is False
    assert "nvme9" in str(error.value) and "nvme0, nvme1" in str(error.value) and "node:1" in str(error.value)
    with pytest.raises(UnknownDeviceError, match="no NUMA node 7"):
        cpu_lease(hosts, "h800-8gpu", {"cpus": 2, "near": "node:7"})
    with pytest.raises(UnknownDeviceError, match="0000:99:00.0"):
        cpu_lease(hosts, "h800-8gpu", {"cpus": 2, "near": "0000:99:00.0"})


def test_cpu_leases_never_share_a_cpu_and_then_wait(hosts):
    topology, _ = hosts("guest-nogpu", GUEST)
    busy: set[int] = set()
    for _ in range(2):  # node 1 has two one-thread cores
        decision = cpu_lease(hosts, "guest-nogpu", {"cpus": 1, "near": "nvme1"}, FreeState(busy_cpus=frozenset(busy)))
        assert not set(decision.cpu_only) & busy and node_of(topology, decision.cpu_only) == {1}
        busy |= set(decision.cpu_only)
    with pytest.raises(InsufficientCpusError) as error:
        cpu_lease(hosts, "guest-nogpu", {"cpus": 1, "near": "nvme1"}, FreeState(busy_cpus=frozenset(busy)))
    assert error.value.retryable is True and "free" in str(error.value)


def test_gpu_leases_and_cpu_leases_draw_from_one_pool(hosts):
    topology, distances = hosts("h800-8gpu")
    gpu = allocate(topology, distances, FreeState(), Request(gpus=4, cpus_per_gpu=6, level="good"))
    gpu_node = next(iter(node_of(topology, gpu.to_json()["cpus"])))
    held = frozenset(gpu.to_json()["cpus"])
    cpu = cpu_lease(hosts, "h800-8gpu", {"cpus": 8, "near": f"node:{gpu_node}"}, FreeState(busy_cpus=held))
    assert not set(cpu.cpu_only) & held
    # ... and the other way round: a GPU lease after a CPU lease cannot get its CPUs.
    first = cpu_lease(hosts, "h800-8gpu", {"cpus": 30, "near": "node:0"})
    later = allocate(topology, distances, FreeState(busy_cpus=frozenset(first.cpu_only)),
                     Request(gpus=1, cpus_per_gpu=2, level="any", must_include=(0,)))
    assert not set(later.to_json()["cpus"]) & set(first.cpu_only)


def test_isolated_nohz_full_and_reserved_cpus_are_never_leased(hosts):
    spec = {**GUEST, "cpu": {**GUEST["cpu"], "isolated": "3", "nohz_full": "1"}}
    topology, _ = hosts("guest-isolated", spec)
    first = cpu_lease(hosts, "guest-isolated", {"cpus": 1, "near": "node:1"}, spec=spec)
    assert first.cpu_only == (2,)  # CPU 3 is isolated
    with pytest.raises(InsufficientCpusError) as never:  # node 1 has one usable CPU, ever
        cpu_lease(hosts, "guest-isolated", {"cpus": 2, "near": "node:1"}, spec=spec)
    assert never.value.retryable is False and "usable" in str(never.value)
    # node 0: CPU 1 is nohz_full, CPU 0 reserved for housekeeping: nothing to lease there
    with pytest.raises(InsufficientCpusError) as none:
        cpu_lease(hosts, "guest-isolated", {"cpus": 1, "near": "node:0"},
                  FreeState(reserved_cpus=frozenset({0})), spec=spec)
    assert none.value.retryable is False


def test_without_near_the_node_with_the_most_free_cpus(hosts):
    topology, _ = hosts("h800-8gpu")
    busy = frozenset(c for c in range(8))  # node 0 has fewer free now
    decision = cpu_lease(hosts, "h800-8gpu", {"cpus": 4}, FreeState(busy_cpus=busy))
    assert node_of(topology, decision.cpu_only) == {1}
    # equal free CPUs: the less loaded node
    loaded = cpu_lease(hosts, "h800-8gpu", {"cpus": 4}, FreeState(node_load={0: 0.9, 1: 0.1}))
    assert node_of(topology, loaded.cpu_only) == {1}


def test_good_keeps_every_cpu_on_the_home_node_any_falls_back_by_numa_distance(hosts):
    topology, _ = hosts("four-nodes", FOUR_NODES)
    with pytest.raises(InsufficientCpusError) as never:  # node 0 has 4 CPUs
        cpu_lease(hosts, "four-nodes", {"cpus": 6, "near": "node:0", "level": "good"}, spec=FOUR_NODES)
    assert never.value.retryable is False and "level 'any'" in str(never.value)
    decision = cpu_lease(hosts, "four-nodes", {"cpus": 6, "near": "node:0", "level": "any"}, spec=FOUR_NODES)
    cpus = decision.cpu_only
    assert len(cpus) == 6 and node_of(topology, cpus) == {0, 2}  # node 2 is nearer than node 1
    assert len([c for c in cpus if topology.cpu(c).numa_node == 0]) == 4  # the home node first, all of it
    assert decision.memory_nodes == (0, 2) and decision.cpu_fallback and decision.level == "any"
    with pytest.raises(InsufficientCpusError) as host_never:
        cpu_lease(hosts, "four-nodes", {"cpus": 17, "level": "any"}, spec=FOUR_NODES)
    assert host_never.value.retryable is False


def test_a_gpu_less_host_grants_cpu_leases_and_still_refuses_gpus(hosts):
    topology, distances = hosts("guest-nogpu", GUEST)
    assert not topology.gpus
    decision = cpu_lease(hosts, "guest-nogpu", {"cpus": 1, "near": "nvme1"})
    assert node_of(topology, decision.cpu_only) == {1}
    with pytest.raises(InsufficientGpusError):
        allocate(topology, distances, FreeState(), Request(gpus=1))
    # the empty host's verdict: possible now, impossible beyond the host
    assert impossibility(topology, distances, Request(gpus=0, cpus=2, near="nvme1")) is None
    never = impossibility(topology, distances, Request(gpus=0, cpus=3, near="nvme1"))
    assert never is not None and never.code == "insufficient_cpus" and never.retryable is False
