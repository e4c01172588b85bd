"""Applying a plan: each errno class through HostRoot.write_fault, modes, irqbalance, rescans."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from irq_helpers import Clock, Kernel, advance_interrupts, built_host, delivered, device_irqs, irq_root, requested

from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings


@pytest.fixture()
def h800(tmp_path: Path, tmp_path_factory):
    built, topology = built_host(tmp_path_factory, "h800-8gpu")
    root = irq_root(built, tmp_path / "host")
    host = HostRoot(root)
    return root, host, topology


def _first_rdma_queue(root: Path) -> int:
    return device_irqs(root, "rdma")[sorted(device_irqs(root, "rdma"))[0]][2]  # comp1 of the first NIC


@pytest.mark.parametrize("code", [errno.EIO, errno.EPERM])
def test_eio_and_eperm_mark_the_irq_permanent_and_it_is_never_written_again(h800, code):
    root, host, topology = h800
    irq = _first_rdma_queue(root)
    kernel = Kernel(host, faults={irq: [code]})
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    report = balancer.cycle(topology)
    assert report.status[irq] == "managed"
    (event,) = [e for e in report.events if e["event"] == "irq_unsettable"]
    assert event["irq"] == irq and event["errno"] == errno.errorcode[code] and event["near_device"] is True
    kernel.writes.clear()
    clock.advance(10_000)
    again = balancer.cycle(topology)
    assert irq not in {i for i, _ in kernel.writes}
    assert again.plan.entry(irq).managed and again.status[irq] == "managed"


def test_enospc_tries_the_next_candidate_cpu(h800):
    root, host, topology = h800
    irq = _first_rdma_queue(root)  # planned on CPU 1 in the storm layout
    kernel = Kernel(host, no_space={irq: {1}})
    report = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock()).cycle(topology)
    tried = [text for i, text in kernel.writes if i == irq]
    assert tried[0] == "1" and len(tried) == 2
    assert delivered(root, irq) == [int(tried[1])] and int(tried[1]) in topology.node(0).cpus
    (event,) = [e for e in report.events if e["event"] == "irq_moved" and e["irq"] == irq]
    assert "no vector space on CPU 1" in event["reason"]


def test_enospc_on_every_candidate_is_transient(h800):
    root, host, topology = h800
    irq = _first_rdma_queue(root)
    Kernel(host, no_space={irq: set(topology.node(0).cpus)})
    report = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock()).cycle(topology)
    assert report.status[irq] == "failed"
    assert requested(root, irq) == [0]


@pytest.mark.parametrize("code", [errno.EBUSY, errno.EAGAIN, errno.EINVAL, errno.ENOMEM])
def test_transient_errors_retry_with_backoff_on_later_cycles(h800, code):
    root, host, topology = h800
    irq = _first_rdma_queue(root)
    kernel = Kernel(host, faults={irq: [code, code]})
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous", retry_base_seconds=10.0), clock=clock)
    leased = {0}  # CPU 0 leased: the IRQ must leave it, so the failure matters every cycle
    first = balancer.cycle(topology, leased)
    (failed,) = [e for e in first.events if e["event"] == "irq_move_failed"]
    assert failed["errno"] == errno.errorcode[code] and failed["attempt"] == 1 and failed["retry_in_seconds"] == 10.0
    clock.advance(5)
    assert balancer.cycle(topology, leased).status[irq] == "retrying"
    clock.advance(6)
    second = balancer.cycle(topology, leased)
    assert [e["retry_in_seconds"] for e in second.events if e["event"] == "irq_move_failed"] == [20.0]
    clock.advance(21)
    third = balancer.cycle(topology, leased)
    assert third.status[irq] == "moved" and delivered(root, irq) != [0]
    assert len([i for i, _ in kernel.writes if i == irq]) == 3


def test_write_happens_only_when_the_value_differs(h800):
    root, host, topology = h800
    kernel = Kernel(host)
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock())
    balancer.cycle(topology)
    kernel.writes.clear()
    assert balancer.cycle(topology).moves == 0
    assert kernel.writes == []


def test_dry_run_reports_the_plan_and_writes_nothing(h800):
    root, host, topology = h800
    kernel = Kernel(host)
    report = IrqBalancer(host, IrqSettings(mode="dry-run"), clock=Clock()).cycle(topology)
    assert kernel.writes == [] and report.moves == 0 and not report.applied
    irq = _first_rdma_queue(root)
    assert report.status[irq] == "planned" and report.plan.entry(irq).planned == (1,)
    body = report.to_json()["irqs"]
    assert {"irq", "device", "class", "current", "planned", "managed", "reason"} <= set(body[0])


def test_off_mode_reads_and_writes_nothing(h800):
    root, host, topology = h800
    kernel = Kernel(host)
    (root / "proc/interrupts").unlink()
    report = IrqBalancer(host, IrqSettings(mode="off")).cycle(topology)
    assert report.mode == "off" and kernel.writes == [] and report.plan.entries == ()


def test_running_irqbalance_with_yield_is_reported_loudly_and_nothing_is_written(h800):
    root, host, topology = h800
    (root / "proc/4242").mkdir()
    (root / "proc/4242/comm").write_text("irqbalance\n")
    kernel = Kernel(host)
    balancer = IrqBalancer(host, IrqSettings(mode="continuous", irqbalance="yield"), clock=Clock())
    report = balancer.cycle(topology)
    assert kernel.writes == [] and report.irqbalance.running
    assert "yielding to irqbalance" in balancer.summary()
    assert any("IRQBALANCE RUNNING" in n and "/proc/4242/comm" in n for n in report.notes)
    assert report.status[_first_rdma_queue(root)] == "held"


def test_running_irqbalance_with_ban_proceeds_and_gives_banirq_guidance(h800):
    root, host, topology = h800
    (root / "run").mkdir()
    (root / "run/irqbalance").mkdir()
    kernel = Kernel(host)
    report = IrqBalancer(host, IrqSettings(mode="continuous", irqbalance="ban"), clock=Clock()).cycle(topology, {4, 5})
    assert report.moves > 0 and kernel.writes
    assert f"--banirq={_first_rdma_queue(root)}" in report.guidance
    assert 'IRQBALANCE_BANNED_CPULIST="4-5"' in report.guidance
    assert 'IRQBALANCE_BANNED_CPUS="00000030"' in report.guidance


def test_no_irqbalance_means_no_guidance(h800):
    root, host, topology = h800
    Kernel(host)
    report = IrqBalancer(host, IrqSettings(mode="continuous", irqbalance="ban"), clock=Clock()).cycle(topology)
    assert not report.irqbalance.running and report.guidance is None


def test_changed_cpu_columns_mean_rescan_without_rates_not_a_crash(h800):
    root, host, topology = h800
    Kernel(host)
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    balancer.cycle(topology)
    lines = (root / "proc/interrupts").read_text().splitlines()
    lines[0] = lines[0].rsplit("CPU63", 1)[0]  # CPU 63 went offline
    (root / "proc/interrupts").write_text("\n".join(lines) + "\n")
    clock.advance(10)
    report = balancer.cycle(topology)
    assert not report.rates and report.rediscover
    assert any("CPU columns changed" in n for n in report.notes)


def test_counters_going_backwards_mean_no_rate_this_cycle(h800):
    root, host, topology = h800
    Kernel(host)
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    irq = _first_rdma_queue(root)
    balancer.cycle(topology)
    clock.advance(10)
    advance_interrupts(root, {irq: 5000})
    assert balancer.cycle(topology).rates
    text = (root / "proc/interrupts").read_text().replace("5000", "   1")
    (root / "proc/interrupts").write_text(text)
    clock.advance(10)
    report = balancer.cycle(topology)
    assert not report.rates and any("went backwards" in n for n in report.notes)


def test_missing_proc_interrupts_plans_nothing_and_says_why(h800):
    root, host, topology = h800
    (root / "proc/interrupts").unlink()
    report = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock()).cycle(topology)
    assert report.plan.entries == () and any("/proc/interrupts unreadable" in n for n in report.notes)


def test_events_carry_irq_device_from_to_reason(h800):
    root, host, topology = h800
    Kernel(host)
    report = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock()).cycle(topology)
    event = next(e for e in report.events if e["event"] == "irq_moved" and e["irq"] == _first_rdma_queue(root))
    assert event["from"] == [0] and event["to"] == [1] and event["device"] == sorted(device_irqs(root, "rdma"))[0]
    assert "spread" in event["reason"]
