"""The planner: a pure function of Topology, load, leases and policy."""

from __future__ import annotations

import pytest

from topod.errors import ConfigError
from topod.irq.classify import IrqInfo
from topod.irq.planner import PlanInput, balance, plan_irqs
from topod.irq.settings import IrqSettings
from topod.model import Cpu, NumaNode, NvlinkFabric, PciDevice, Topology


def make_topology(nodes: int = 2, cores: int = 4, threads: int = 2, isolated=(), nohz=()) -> Topology:
    total = nodes * cores
    cpus, node_cpus = [], {n: [] for n in range(nodes)}
    for thread in range(threads):
        for core in range(total):
            cpu = thread * total + core
            node = core // cores
            node_cpus[node].append(cpu)
            cpus.append(Cpu(cpu, True, core % cores, node, node, tuple(t * total + core for t in range(threads)),
                            node * cores, cpu in isolated, cpu in nohz))
    numa = tuple(NumaNode(n, tuple(sorted(node_cpus[n])), {m: 10 if m == n else 10 + 11 * abs(m - n)
                                                           for m in range(nodes)}, None) for n in range(nodes))
    devices = tuple(PciDevice(f"0000:{0x10 + i:02x}:00.0", 0x15B3, 0x1021, 0x020700, "rdma", "mlx5_core", None,
                              "pci0000:00", None, None, i % nodes, i % nodes, "firmware",
                              tuple(sorted(node_cpus[i % nodes])), None, (), (f"mlx5_{i}",))
                    for i in range(nodes * 2))
    return Topology("/", numa, tuple(sorted(cpus, key=lambda c: c.id)), devices, (), NvlinkFabric(), ())


def make_irqs(topology: Topology, queues: int = 4, *, on=(0,)) -> tuple[dict[int, IrqInfo], dict]:
    irqs, current, irq = {}, {}, 100
    for device in topology.pci_devices:
        for q in range(queues):
            irqs[irq] = IrqInfo(irq, f"mlx5_comp{q}@pci:{device.address}", device.address, "rdma", "queue", q, "name")
            current[irq] = tuple(on)
            irq += 1
    return irqs, current


def _plan(topology, irqs, current, settings=None, **inputs):
    return plan_irqs(topology, PlanInput(irqs, current, **inputs), settings or IrqSettings())


def _cpu_counts(plan) -> dict[int, int]:
    counts: dict[int, int] = {}
    for entry in plan.entries:
        for cpu in entry.planned or ():
            counts[cpu] = counts.get(cpu, 0) + 1
    return counts


def test_queues_take_physical_cores_in_core_order_then_siblings():
    topology = make_topology(nodes=1, cores=4, threads=2)
    irqs, current = make_irqs(topology, queues=3)  # two devices, 6 queues on 4 cores / 8 CPUs
    plan = _plan(topology, irqs, current)
    assert [plan.entry(irq).planned for irq in sorted(irqs)] == [(0,), (1,), (2,), (3,), (4,), (5,)]


def test_several_devices_on_a_node_share_its_cores_evenly():
    topology = make_topology(nodes=2, cores=4, threads=2)
    irqs, current = make_irqs(topology, queues=5)  # 10 queues per node on 8 CPUs
    counts = _cpu_counts(_plan(topology, irqs, current))
    for node in topology.numa_nodes:
        per_cpu = [counts.get(cpu, 0) for cpu in node.cpus]
        assert max(per_cpu) - min(per_cpu) <= 1 and sum(per_cpu) == 10


def test_irqs_stay_on_their_devices_node():
    topology = make_topology()
    irqs, current = make_irqs(topology)
    plan = _plan(topology, irqs, current)
    for entry in plan.entries:
        device = topology.device(entry.device)
        assert set(entry.planned) <= set(device.local_cpus)


def test_rdma_irqs_avoid_leased_isolated_nohz_and_banned_cpus():
    topology = make_topology(isolated=(1,), nohz=(2,))
    irqs, current = make_irqs(topology)
    plan = _plan(topology, irqs, current, IrqSettings(banned_cpus=frozenset({3})), leased_cpus=frozenset({8, 9}))
    assert not set(_cpu_counts(plan)) & {1, 2, 3, 8, 9}


def test_a_core_with_a_busy_sibling_is_used_after_free_cores():
    topology = make_topology(nodes=1, cores=4, threads=2)
    irqs, current = make_irqs(topology, queues=2)  # 4 queues
    plan = _plan(topology, irqs, current, leased_cpus=frozenset({4}))  # sibling of CPU 0
    assert sorted(_cpu_counts(plan)) == [1, 2, 3, 5]


def test_when_leases_hold_all_near_cpus_the_nodes_housekeeping_cpus_take_the_irqs():
    topology = make_topology()
    irqs, current = make_irqs(topology)
    node0 = set(topology.node(0).cpus)
    settings = IrqSettings(housekeeping_cpus=frozenset({0, 8}))
    plan = _plan(topology, irqs, current, settings, leased_cpus=frozenset(node0 - {0, 8}))
    node0_entries = [e for e in plan.entries if topology.device(e.device).numa_node == 0]
    assert {e.planned[0] for e in node0_entries} == {0, 8}
    assert all("housekeeping" in e.reason for e in node0_entries)


def test_housekeeping_cpus_are_kept_clear_while_free_cores_exist():
    topology = make_topology()
    irqs, current = make_irqs(topology)
    plan = _plan(topology, irqs, current, IrqSettings(housekeeping_cpus=frozenset({0, 8})))
    assert not {0, 8} & set(_cpu_counts(plan))


def test_without_housekeeping_cpus_the_nearest_node_takes_them_and_the_reason_says_so():
    topology = make_topology(nodes=3)
    irqs, current = make_irqs(topology)
    plan = _plan(topology, irqs, current, leased_cpus=frozenset(topology.node(0).cpus))
    node0_entries = [e for e in plan.entries if topology.device(e.device).numa_node == 0]
    assert all(set(e.planned) <= set(topology.node(1).cpus) for e in node0_entries)
    assert all("nearest node 1 (SLIT distance 21)" in e.reason for e in node0_entries)


def test_nothing_eligible_anywhere_leaves_the_irq_and_says_so():
    topology = make_topology(nodes=1)
    irqs, current = make_irqs(topology)
    plan = _plan(topology, irqs, current, leased_cpus=frozenset(topology.online_cpus))
    assert all(e.planned is None and "no eligible CPU" in e.reason for e in plan.entries)


def test_pin_node_policy_gives_the_whole_eligible_node():
    topology = make_topology()
    irqs, current = make_irqs(topology, queues=1)
    plan = _plan(topology, irqs, current, IrqSettings(policy={"rdma": "pin-node"}), leased_cpus=frozenset({1}))
    entry = plan.entries[0]
    assert entry.policy == "pin-node" and entry.planned == tuple(c for c in topology.node(0).cpus if c != 1)


def test_irq_override_beats_device_override_beats_class_policy():
    topology = make_topology()
    irqs, current = make_irqs(topology, queues=2)
    settings = IrqSettings(irq_overrides={"100": "leave", "mlx5_comp1@pci:0000:10:00.0": "2-3"},
                           device_overrides={"mlx5_1": "pin-node"})
    plan = _plan(topology, irqs, current, settings)
    assert plan.entry(100).planned is None and "IRQ override" in plan.entry(100).reason
    assert plan.entry(101).planned == (2, 3)
    assert plan.entry(102).policy == "pin-node" and "device override 'mlx5_1'" in plan.entry(102).reason


def test_other_class_is_left_alone_by_default():
    topology = make_topology()
    irqs = {0: IrqInfo(0, "timer", None, "other", "queue", None, "none")}
    assert _plan(topology, irqs, {0: (0,)}).entry(0).planned is None


def test_unsettable_irqs_are_reported_managed_and_not_counted():
    topology = make_topology(nodes=1, cores=4, threads=1)
    irqs, current = make_irqs(topology, queues=2)
    plan = _plan(topology, irqs, current, unsettable={100: "kernel-managed"})
    assert plan.entry(100).managed and plan.entry(100).planned is None
    assert sorted(_cpu_counts(plan)) == [0, 1, 2]


def test_balance_keeps_irqs_that_fit_and_moves_only_the_excess():
    order = (0, 1, 2, 3)
    placed = balance(order, [10, 11, 12, 13], {10: 0, 11: 1, 12: 2, 13: 2})
    assert placed[10] == 0 and placed[11] == 1 and placed[13] == 3 and placed[12] == 2


def test_balance_lays_out_a_storm_afresh_in_core_order():
    assert balance((0, 1, 2), [10, 11, 12, 13], dict.fromkeys([10, 11, 12, 13], 0)) == {10: 0, 11: 1, 12: 2, 13: 0}


def test_enospc_alternatives_are_the_next_cpus_of_the_pool():
    topology = make_topology(nodes=1, cores=4, threads=1)
    irqs, current = make_irqs(topology, queues=1, on=(0, 1, 2, 3))
    plan = _plan(topology, irqs, current)
    assert plan.entry(100).planned == (0,) and plan.entry(100).alternatives == (1, 2, 3)


def test_settings_from_a_config_section():
    settings = IrqSettings.from_section({"banned_cpus": "0-1", "policy": {"nvme": "leave"},
                                         "device_overrides": {"mlx5_0": "4-7"}})
    assert settings.banned_cpus == {0, 1} and settings.policy["nvme"] == "leave" and settings.policy["rdma"] == "spread"


@pytest.mark.parametrize(("section", "message"), [
    ({"policy": {"fpga": "spread"}}, "irq.policy.fpga: unknown IRQ class"),
    ({"policy": {"rdma": "scatter"}}, "irq.policy.rdma: 'scatter' is not one of"),
    ({"irq_overrides": {"65": "7-"}}, "irq.irq_overrides.65: '7-' is neither"),
    ({"device_overrides": "mlx5_0"}, "irq.device_overrides: expected a table"),
    ({"banned_cpus": "3-1"}, "irq.banned_cpus"),
    ({"mode": "auto"}, "irq.mode: 'auto' is not one of"),
    ({"irqbalance": "fight"}, "irq.irqbalance: 'fight' is not one of"),
    ({"min_gain": 1.5}, "irq.min_gain"),
])
def test_bad_settings_get_an_error_naming_the_key(section, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        IrqSettings.from_section(section)
