"""End-to-end IRQ balancing on host-tree copies (all through HostRoot, never the real /proc)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from irq_helpers import Clock, Kernel, advance_interrupts, built_host, delivered, device_irqs, irq_root, managed_irqs

from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings
from topod.record import replace


def _tree(tmp_path: Path, factory, name: str = "h800-8gpu"):
    built, topology = built_host(factory, name)
    return irq_root(built, tmp_path / "host"), topology


def _plus_one_rdma(spec: dict) -> None:
    spec["root_complex"][3]["devices"] = ["nic", "rdma"]  # a ninth RDMA NIC on node 1, IRQs numbered last


def _setup(root: Path, settings: IrqSettings | None = None, managed: bool = True):
    host = HostRoot(root)
    kernel = Kernel(host, managed=managed_irqs(root) if managed else ())
    clock = Clock()
    return host, kernel, clock, IrqBalancer(host, settings or IrqSettings(mode="continuous"), clock=clock)


def _spread_irqs_by_cpu(root: Path, topology, node: int) -> dict[int, int]:
    """CPU -> number of this node's RDMA/NIC IRQs delivered there."""
    counts: dict[int, int] = {}
    for kind in ("rdma", "nic"):
        for address, irqs in device_irqs(root, kind).items():
            if topology.device(address).numa_node == node:
                for irq in irqs:
                    for cpu in delivered(root, irq):
                        counts[cpu] = counts.get(cpu, 0) + 1
    return counts


def _assert_even(counts: dict[int, int], candidates: set[int]) -> None:
    assert set(counts) <= candidates, f"IRQs on non-candidate CPUs {set(counts) - candidates}"
    per_cpu = [counts.get(cpu, 0) for cpu in candidates]
    assert max(per_cpu) - min(per_cpu) <= 1, counts


def test_storm_is_spread_over_each_nics_own_node_avoiding_leased_and_isolated(tmp_path, tmp_path_factory):
    root, topology = _tree(tmp_path, tmp_path_factory)
    # isolcpus=15,47 (discovery of isolated CPUs is tested with discovery)
    topology = replace(topology, cpus=tuple(replace(c, isolated=c.id in (15, 47)) for c in topology.cpus))
    host, _, _, balancer = _setup(root)
    leased = {4, 5, 36, 37, 20, 52}
    assert all(delivered(root, irq) == [0] for irqs in device_irqs(root, "rdma").values() for irq in irqs)

    report = balancer.cycle(topology, leased)

    assert report.moves > 0
    for address, irqs in device_irqs(root, "rdma").items():
        near = set(topology.device(address).local_cpus)
        cpus = [delivered(root, irq)[0] for irq in irqs]
        assert set(cpus) <= near - leased - {15, 47}
        assert len(set(cpus)) == len(cpus), f"{address}: two queues share a CPU"
    for node in (0, 1):
        candidates = set(topology.node(node).cpus) - leased - {15, 47}
        _assert_even(_spread_irqs_by_cpu(root, topology, node), candidates)


def test_one_nics_queues_take_physical_cores_in_core_order_before_siblings(tmp_path, tmp_path_factory):
    root, topology = _tree(tmp_path, tmp_path_factory)
    host, _, _, balancer = _setup(root)
    balancer.cycle(topology)
    first_nic = sorted(device_irqs(root, "rdma"))[0]
    irqs = device_irqs(root, "rdma")[first_nic]  # async0, comp0..comp7
    comp_cpus = [delivered(root, irq)[0] for irq in irqs[1:]]
    assert comp_cpus == list(range(8)), "queue i on physical core i (node 0's first threads are CPUs 0-15)"


def test_lease_on_cores_holding_irqs_moves_them_off_in_one_cycle_and_back_after_release(tmp_path, tmp_path_factory):
    root, topology = _tree(tmp_path, tmp_path_factory)
    host, _, _, balancer = _setup(root)
    balancer.cycle(topology)
    node0 = set(topology.node(0).cpus)
    holding = {cpu for cpu, n in _spread_irqs_by_cpu(root, topology, 0).items() if n}
    leased = set(sorted(holding)[:6])

    during = balancer.cycle(topology, leased)

    assert during.moves > 0
    counts = _spread_irqs_by_cpu(root, topology, 0)
    _assert_even(counts, node0 - leased)
    assert not leased & set(counts)
    moved = {e["irq"] for e in during.events if e["event"] == "irq_moved"}
    assert len(moved) < 36, "a lease moves only what it must, not every IRQ of the node"

    after = balancer.cycle(topology, set())

    _assert_even(_spread_irqs_by_cpu(root, topology, 0), node0)
    assert after.moves > 0


def test_managed_nvme_vectors_are_reported_managed_never_retried_and_logged_once(tmp_path, tmp_path_factory):
    root, topology = _tree(tmp_path, tmp_path_factory)
    host, kernel, clock, balancer = _setup(root)
    managed = set(managed_irqs(root))

    first = balancer.cycle(topology)
    announced = [e["irq"] for e in first.events if e["event"] == "irq_unsettable"]
    assert sorted(announced) == sorted(managed)
    for _ in range(3):
        clock.advance(3600)
        kernel.writes.clear()
        later = balancer.cycle(topology)
        assert not {irq for irq, _ in kernel.writes} & managed, "a managed IRQ was written again"
        assert not [e for e in later.events if e["event"] == "irq_unsettable"]
    body = {e["irq"]: e for e in later.to_json()["irqs"]}
    nvme1 = device_irqs(root, "nvme")
    node1_nvme = next(irqs for addr, irqs in nvme1.items() if topology.device(addr).numa_node == 1)
    assert body[node1_nvme[1]]["managed"] is True
    assert body[node1_nvme[1]]["status"] == "managed"
    assert "CPU 0, NOT near the device" in body[node1_nvme[1]]["reason"]
    node0_nvme = next(irqs for addr, irqs in nvme1.items() if topology.device(addr).numa_node == 0)
    assert "near the device" in body[node0_nvme[1]]["reason"]
    # Counts stay even among the CPUs topod does move, managed vectors aside.
    _assert_even(_spread_irqs_by_cpu(root, topology, 0), set(topology.node(0).cpus))


def test_device_hot_added_mid_run_is_balanced_in_the_next_cycle(tmp_path, tmp_path_factory):
    root, topology = _tree(tmp_path, tmp_path_factory)
    host, _, _, balancer = _setup(root)
    balancer.cycle(topology)
    # The host after the hot-add: the same machine rebuilt with one more device, rediscovered.
    fresh, grown = built_host(tmp_path_factory, "h800-8gpu", _plus_one_rdma, key="plus-one-rdma")
    old_irqs = {int(entry.name) for entry in (root / "proc/irq").iterdir()}
    shutil.copy(fresh / "proc/interrupts", root / "proc/interrupts")
    for irq_dir in (fresh / "proc/irq").iterdir():
        if int(irq_dir.name) not in old_irqs:
            shutil.copytree(irq_dir, root / "proc/irq" / irq_dir.name)
    (added,) = [a for a in device_irqs(fresh, "rdma") if a not in device_irqs(root, "rdma")]
    new_irqs = device_irqs(fresh, "rdma")[added]
    assert all(delivered(root, irq) == [0] for irq in new_irqs)

    report = balancer.cycle(grown)

    moved = {e["irq"] for e in report.events if e["event"] == "irq_moved"}
    assert set(new_irqs) <= moved
    near = set(grown.device(added).local_cpus)
    cpus = [delivered(root, irq)[0] for irq in new_irqs]
    assert set(cpus) <= near and len(set(cpus)) == len(cpus)
    _assert_even(_spread_irqs_by_cpu(root, grown, 1), set(grown.node(1).cpus))


def test_steady_noisy_load_converges_and_then_never_flaps(tmp_path, tmp_path_factory):
    root, topology = _tree(tmp_path, tmp_path_factory)
    settings = IrqSettings(mode="continuous", cooldown_seconds=15.0, min_gain=0.2)
    host, _, clock, balancer = _setup(root, settings)
    first = balancer.cycle(topology)
    # Make both IRQs on every doubled-up CPU hot: only load-awareness can separate them.
    irqs = [irq for group in device_irqs(root, "rdma").values() for irq in group]
    doubled = {cpu for cpu, n in first.per_cpu_irqs.items() if n == 2}
    rates = {irq: (20000 if delivered(root, irq)[0] in doubled else 500) for irq in irqs}
    assert sum(r == 20000 for r in rates.values()) >= 4
    noise = random.Random(7)
    moves, imbalances = [], []
    for _ in range(14):
        clock.advance(10.0)
        advance_interrupts(root, {irq: int(r * 10 * noise.uniform(0.97, 1.03)) for irq, r in rates.items()})
        report = balancer.cycle(topology)
        moves.append(report.moves)
        imbalances.append(report.plan.imbalance_after)
    assert sum(moves[:6]) > 0, "the hot IRQs were never moved off their crowded cores"
    assert moves[-6:] == [0] * 6, f"moves per cycle kept coming: {moves}"
    hot_cpus = [delivered(root, irq)[0] for irq, r in rates.items() if r == 20000]
    assert len(hot_cpus) == len(set(hot_cpus)), "two hot IRQs still share a CPU"
    assert imbalances[-1] < imbalances[0]
