"""The re-plan baseline: which IRQs a lease change touches (pure, no host)."""

from __future__ import annotations

from test_irq_planner import make_irqs, make_topology

from topod.irq.baseline import Baseline
from topod.irq.procfs import IrqAffinity
from topod.irq.settings import IrqSettings


def _baseline(topology, irqs, current, leased=frozenset(), settings=None):
    affinity = {irq: IrqAffinity(cpus, cpus, None) for irq, cpus in current.items()}
    return Baseline.build(topology, settings or IrqSettings(), "continuous", True, False, frozenset(leased),
                          irqs, affinity, None, {})


def _node_irqs(topology, irqs, node):
    return sorted(irq for irq, info in irqs.items() if topology.device(info.device).numa_node == node)


def test_a_lease_on_one_node_touches_only_that_nodes_spread_group():
    topology = make_topology(nodes=4, cores=4, threads=2)
    irqs, current = make_irqs(topology, queues=4)
    base = _baseline(topology, irqs, current)
    node2_cpu = topology.node(2).cpus[0]
    todo, pools = base.lease_change(frozenset({node2_cpu}))
    assert todo == _node_irqs(topology, irqs, 2) and pools == 2  # the node's two devices
    assert base.leased == {node2_cpu}
    todo, pools = base.lease_change(frozenset())  # released: the same group again
    assert todo == _node_irqs(topology, irqs, 2)


def test_no_change_in_the_leased_set_touches_nothing():
    topology = make_topology(nodes=2)
    irqs, current = make_irqs(topology)
    base = _baseline(topology, irqs, current, {1})
    assert base.lease_change(frozenset({1})) == ([], 0)


def test_a_lease_on_a_housekeeping_cpu_changes_no_pool():
    topology = make_topology(nodes=2, cores=4, threads=2)
    irqs, current = make_irqs(topology)
    base = _baseline(topology, irqs, current, settings=IrqSettings(housekeeping_cpus=frozenset({0})))
    assert base.lease_change(frozenset({0})) == ([], 0)


def test_leasing_a_whole_node_moves_its_devices_to_the_nearest_node_and_rebalances_that_node_too():
    topology = make_topology(nodes=3, cores=2, threads=1)
    irqs, current = make_irqs(topology, queues=2)
    base = _baseline(topology, irqs, current)
    todo, pools = base.lease_change(frozenset(topology.node(0).cpus))
    # Node 0's devices fall back to node 1 (nearest), so node 1's group is re-planned with them.
    assert todo == sorted(_node_irqs(topology, irqs, 0) + _node_irqs(topology, irqs, 1))
    assert pools == 2 and base.pools[irqs[todo[0]].device].watch is None
    # Node 2 is untouched; any later change is checked against the fallen-back devices.
    todo, _ = base.lease_change(frozenset(topology.node(0).cpus) | {topology.node(2).cpus[0]})
    assert set(_node_irqs(topology, irqs, 2)) <= set(todo)
