"""A full cycle on a quiet host does only what changed (issue 26): with the same IRQs,
affinities, rates, leases and cooldowns it reuses the last plan rather than planning every
IRQ again; anything that changed (an IRQ moved behind topod's back, interrupts counted)
is read and planned as before, on the very next cycle. An IRQ's affinity files are read
again when it took an interrupt (its /proc/interrupts line changed), and every IRQ's at
least every AFFINITY_REFRESH_SECONDS: an IRQ that stays silent loads no CPU wherever it
points."""

from __future__ import annotations

from pathlib import Path

import pytest
from irq_helpers import Clock, Kernel, advance_interrupts, built_host, device_irqs, irq_root, managed_irqs, requested

from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings
from topod.irq.procfs import AFFINITY_REFRESH_SECONDS


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


def _reads(balancer, monkeypatch) -> list[str]:
    """The files the balancer's host reads from now on."""
    read, seen = balancer.host.read, []

    def recording(rel, **kwargs):
        seen.append(rel)
        return read(rel, **kwargs)

    monkeypatch.setattr(balancer.host, "read", recording)
    return seen


def test_a_quiet_cycle_reads_three_files_not_two_per_irq(converged, monkeypatch):
    root, topology, clock, balancer = converged
    irqs = len(balancer.previous.interrupts.lines)
    seen = _reads(balancer, monkeypatch)
    clock.advance(10)
    balancer.cycle(topology)
    assert not [rel for rel in seen if rel.startswith("proc/irq/")]
    assert {"proc/interrupts", "proc/softirqs", "proc/stat"} <= set(seen)
    # an IRQ that took interrupts is read again; at the refresh, every IRQ
    irq = next(iter(device_irqs(root, "nic").values()))[0]
    advance_interrupts(root, {irq: 10})
    clock.advance(10)
    balancer.cycle(topology)
    assert [rel for rel in seen if rel.startswith("proc/irq/")] == [
        f"proc/irq/{irq}/smp_affinity_list", f"proc/irq/{irq}/effective_affinity_list"]
    seen.clear()
    clock.advance(AFFINITY_REFRESH_SECONDS)
    balancer.cycle(topology)
    assert len([rel for rel in seen if rel.startswith("proc/irq/")]) == 2 * irqs


def _moved_elsewhere(root, topology):
    address, irqs = next(iter(device_irqs(root, "nic").items()))
    irq = irqs[0]
    near = topology.device(address).numa_node
    elsewhere = next(cpu.id for cpu in topology.cpus if cpu.online and cpu.numa_node != near)
    placed = requested(root, irq)
    for name in ("smp_affinity_list", "effective_affinity_list"):
        (root / f"proc/irq/{irq}/{name}").write_text(f"{elsewhere}\n")
    return irq, placed, elsewhere


def test_a_moved_irq_that_fires_is_moved_back_on_the_next_cycle_a_silent_one_at_the_refresh(converged):
    root, topology, clock, balancer = converged
    clock.advance(AFFINITY_REFRESH_SECONDS)  # past the refresh and the cooldown of topod's own moves
    balancer.cycle(topology)
    irq, placed, elsewhere = _moved_elsewhere(root, topology)
    clock.advance(10)
    assert balancer.cycle(topology).moves == 0, "silent: not read again yet"
    assert requested(root, irq) == [elsewhere]
    advance_interrupts(root, {irq: 1})  # it fires where it was moved
    clock.advance(10)
    report = balancer.cycle(topology)
    assert [(e["event"], e["irq"]) for e in report.events] == [("irq_moved", irq)]
    assert requested(root, irq) == placed
    # moved again, and silent from then on: back within one refresh
    clock.advance(AFFINITY_REFRESH_SECONDS)
    balancer.cycle(topology)
    _moved_elsewhere(root, topology)
    moved_at = None
    for step in range(1, 8):
        clock.advance(10)
        if balancer.cycle(topology).moves:
            moved_at = step * 10
            break
    assert moved_at is not None and moved_at <= AFFINITY_REFRESH_SECONDS
    assert requested(root, irq) == placed


def test_what_topod_wrote_is_its_view_until_the_irq_fires(converged, monkeypatch):
    """The cycle's own writes update the view the next snapshot keeps: a quiet IRQ topod
    moved is not written again every cycle."""
    root, topology, clock, balancer = converged
    clock.advance(AFFINITY_REFRESH_SECONDS)
    balancer.cycle(topology)
    irq, placed, _ = _moved_elsewhere(root, topology)
    advance_interrupts(root, {irq: 1})
    clock.advance(10)
    assert balancer.cycle(topology).moves == 1 and requested(root, irq) == placed
    for _ in range(4):
        clock.advance(10)
        report = balancer.cycle(topology)
        assert report.moves == 0 and not report.events
