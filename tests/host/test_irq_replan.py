"""Re-planning after a lease change, from the last full cycle's baseline, without /proc scans."""

from __future__ import annotations

import copy
import errno
import shutil
from pathlib import Path

import pytest
from irq_helpers import (Clock, Kernel, ReadLog, advance_interrupts, built_host, device_irqs, irq_root,
                         managed_irqs, requested)

from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings


@pytest.fixture()
def h800(tmp_path: Path, tmp_path_factory):
    built, topology = built_host(tmp_path_factory, "h800-8gpu")
    root = irq_root(built, tmp_path / "host")
    return root, topology


def _converged(root: Path, topology, leased=()):
    host = HostRoot(root)
    kernel = Kernel(host, managed=managed_irqs(root))
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    balancer.cycle(topology, leased)
    clock.advance(10)
    assert balancer.cycle(topology, leased).moves == 0
    kernel.writes.clear()
    return host, kernel, clock, balancer


def _all_irqs(root: Path) -> list[int]:
    return sorted(int(p.name) for p in (root / "proc/irq").iterdir())


def _node_irqs(root: Path, topology, node: int) -> set[int]:
    return {irq for kind in ("rdma", "nic", "nvme") for address, irqs in device_irqs(root, kind).items()
            if topology.device(address).numa_node == node for irq in irqs}


def _full_cycle_on_a_copy(balancer: IrqBalancer, root: Path, dest: Path, topology, leased) -> dict[int, list[int]]:
    """What a full cycle does from the same state (the balancer's and the host's, copied):
    requested CPUs per IRQ."""
    shutil.copytree(root, dest)
    twin = copy.deepcopy(balancer, memo={id(balancer.host): None})
    twin.host = HostRoot(dest)
    Kernel(twin.host, managed=managed_irqs(dest))
    report = twin.cycle(topology, leased)
    assert report.kind == "full" and not [e for e in report.events if e["event"] == "irq_unsettable"]
    return {irq: requested(dest, irq) for irq in _all_irqs(dest)}


def test_a_lease_moves_the_same_irqs_a_full_cycle_would_and_rewrites_nothing_else(h800, tmp_path):
    root, topology = h800
    host, kernel, clock, balancer = _converged(root, topology)
    before = {irq: requested(root, irq) for irq in _all_irqs(root)}
    holding = sorted({cpus[0] for irq, cpus in before.items() if irq in _node_irqs(root, topology, 0)
                      and cpus != [0]})
    leased = set(holding[2:6])
    expected = _full_cycle_on_a_copy(balancer, root, tmp_path / "fresh", topology, leased)
    reads = ReadLog(host)

    report = balancer.replan(topology, leased)

    after = {irq: requested(root, irq) for irq in _all_irqs(root)}
    assert after == expected, "re-plan and a full cycle disagree"
    moved = {irq for irq in after if after[irq] != before[irq]}
    assert moved and {e["irq"] for e in report.events if e["event"] == "irq_moved"} == moved
    assert {irq for irq, _ in kernel.writes} == moved, "an IRQ was written that did not move"
    assert not {cpu for irq in moved for cpu in after[irq]} & leased
    # Node 1's devices share no CPU with the lease: not even planned.
    planned = {e.irq for e in report.plan.entries}
    assert planned and not planned & _node_irqs(root, topology, 1)
    assert report.kind == "replan" and report.moves == len(moved)
    # No /proc scan: only the IRQs written were read back.
    assert "proc/interrupts" not in reads.paths and not any(p.startswith("proc/stat") for p in reads.paths)
    assert reads.irqs() == moved


def test_a_release_is_replanned_back_like_a_full_cycle(h800, tmp_path):
    root, topology = h800
    host, kernel, clock, balancer = _converged(root, topology)
    leased = {2, 3, 4, 5, 34, 35}
    balancer.replan(topology, leased)
    expected = _full_cycle_on_a_copy(balancer, root, tmp_path / "fresh", topology, set())
    kernel.writes.clear()
    report = balancer.replan(topology, set())
    assert {irq: requested(root, irq) for irq in _all_irqs(root)} == expected
    assert report.moves > 0 and len(kernel.writes) == report.moves
    # And the next full cycle on its interval finds nothing left to do.
    clock.advance(10)
    assert balancer.cycle(topology, set()).moves == 0


def test_the_same_leases_again_plan_and_write_nothing(h800):
    root, topology = h800
    host, kernel, clock, balancer = _converged(root, topology, {4, 5})
    reads = ReadLog(host)
    report = balancer.replan(topology, {4, 5})
    assert report.plan.entries == () and report.moves == 0 and kernel.writes == [] and reads.paths == []


def test_without_a_full_cycle_yet_replan_is_a_full_cycle(h800):
    root, topology = h800
    host = HostRoot(root)
    Kernel(host)
    reads = ReadLog(host)
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock())
    report = balancer.replan(topology, {4})
    assert report.kind == "full" and "proc/interrupts" in reads.paths and report.moves > 50
    assert balancer.health()["cycles"] == 1


def test_a_replan_while_proc_irq_is_read_only_writes_nothing(h800):
    root, topology = h800
    host = HostRoot(root)
    kernel = Kernel(host, refuse_all=errno.EROFS)
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock())
    balancer.cycle(topology)
    kernel.writes.clear()
    report = balancer.replan(topology, {1, 2, 3})
    assert kernel.writes == [] and report.events == () and "unwritable" in report.status.values()
    assert balancer.health()["writable"] is False


def test_report_shows_the_full_plan_with_the_replanned_irqs_laid_over_it(h800):
    root, topology = h800
    host, kernel, clock, balancer = _converged(root, topology)
    full = {e["irq"]: e for e in balancer.report()["irqs"]}
    total = balancer.health()["moves_total"]
    report = balancer.replan(topology, {1})
    body = balancer.report()
    shown = {e["irq"]: e for e in body["irqs"]}
    assert shown.keys() == full.keys() and body["kind"] == "replan" and body["replans"] == 1
    event = next(e for e in report.events if e["event"] == "irq_moved")
    assert shown[event["irq"]]["planned"] == event["to"] and shown[event["irq"]]["status"] == "moved"
    assert balancer.health()["moves_total"] == total + len(kernel.writes) == total + report.moves


def test_with_rates_the_replan_keeps_the_load_placement_of_a_full_cycle(h800):
    root, topology = h800
    host, kernel, clock, balancer = _converged(root, topology)
    irqs = sorted(_node_irqs(root, topology, 0) - set(managed_irqs(root)))
    clock.advance(10)
    advance_interrupts(root, {irq: (200000 if i % 5 == 0 else 5000) for i, irq in enumerate(irqs)})
    balancer.cycle(topology)  # rates measured; the hot IRQs are placed by load
    clock.advance(1000)  # past every cooldown
    before = {irq: requested(root, irq) for irq in irqs}
    leased = {cpus[0] for cpus in before.values()} - {0}
    leased = set(sorted(leased)[:3])
    report = balancer.replan(topology, leased)
    assert report.rates and report.moves > 0
    assert not {cpu for irq in irqs for cpu in requested(root, irq)} & leased
