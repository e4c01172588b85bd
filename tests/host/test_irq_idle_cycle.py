"""A full cycle on a quiet host does only what changed (issue 26): with the same IRQs,
affinities, rates, leases and cooldowns it reuses the last plan rather than planning every
IRQ again; anything that changed (an IRQ moved behind topod's back, interrupts counted)
is read and planned as before, on the very next cycle."""

from __future__ import annotations

from pathlib import Path

import pytest
from irq_helpers import Clock, Kernel, advance_interrupts, built_host, device_irqs, irq_root, managed_irqs, requested

from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings


@pytest.fixture()
def converged(tmp_path: Path, tmp_path_factory):
    built, topology = built_host(tmp_path_factory, "h800-8gpu")
    root = irq_root(built, tmp_path / "host")
    host = HostRoot(root)
    Kernel(host, managed=managed_irqs(root))
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    balancer.cycle(topology)
    clock.advance(10)
    assert balancer.cycle(topology).moves == 0
    return root, topology, clock, balancer


def test_a_cycle_with_nothing_changed_reuses_the_plan_and_writes_nothing(converged):
    root, topology, clock, balancer = converged
    plan, pools = balancer.last.plan, balancer._base.pools
    clock.advance(10)
    report = balancer.cycle(topology)
    assert report.plan is plan and report.moves == 0 and not report.events
    assert balancer._base.pools is pools  # the re-plan baseline's pools taken over, not rebuilt


def test_an_irq_moved_behind_topods_back_is_planned_and_moved_back_on_the_next_cycle(converged):
    root, topology, clock, balancer = converged
    plan = balancer.last.plan
    address, irqs = next(iter(device_irqs(root, "nic").items()))
    irq = irqs[0]
    placed = requested(root, irq)
    near = topology.device(address).numa_node
    elsewhere = next(cpu.id for cpu in topology.cpus if cpu.online and cpu.numa_node != near)
    for name in ("smp_affinity_list", "effective_affinity_list"):
        (root / f"proc/irq/{irq}/{name}").write_text(f"{elsewhere}\n")
    clock.advance(61)  # past the cooldown of topod's own last move
    report = balancer.cycle(topology)
    assert report.plan is not plan
    assert [(e["event"], e["irq"]) for e in report.events] == [("irq_moved", irq)]
    assert requested(root, irq) == placed


def test_interrupts_counted_make_a_new_plan_from_the_new_rates(converged):
    root, topology, clock, balancer = converged
    plan = balancer.last.plan
    irq = next(iter(device_irqs(root, "nic").values()))[0]
    advance_interrupts(root, {irq: 50_000})
    clock.advance(10)
    report = balancer.cycle(topology)
    assert report.plan is not plan
    assert balancer.last_load.irq_rate[irq] == pytest.approx(5_000.0)
