"""Hostile answers from /proc/irq: a read-only tree (EROFS), unknown errnos, and what the
report, the health body and the STATUS= line say about them."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from irq_helpers import Clock, Kernel, advance_interrupts, built_host, delivered, device_irqs, irq_root

from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings


@pytest.fixture()
def h800(tmp_path: Path, tmp_path_factory):
    built, topology = built_host(tmp_path_factory, "h800-8gpu")
    root = irq_root(built, tmp_path / "host")
    return root, HostRoot(root), topology


def _first_rdma_queue(root: Path) -> int:
    return device_irqs(root, "rdma")[sorted(device_irqs(root, "rdma"))[0]][2]


def _events(reports, name: str | None = None) -> list[dict]:
    return [e for r in reports for e in r.events if name is None or e["event"] == name]


def test_read_only_proc_irq_is_reported_once_not_per_irq_per_cycle(h800):
    root, host, topology = h800
    kernel = Kernel(host, refuse_all=errno.EROFS)
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    reports = []
    for _ in range(3):
        reports.append(balancer.cycle(topology))
        clock.advance(3600)  # far past any retry backoff: nothing may be "retried later"

    assert [e["event"] for e in _events(reports)] == ["irq_writes_impossible"]
    (event,) = _events(reports)
    assert event["errno"] == "EROFS" and "read-only" in event["reason"]
    assert not balancer.retries and not balancer.unsettable
    # One write found the tree read-only; later full cycles each probe once, no more.
    assert len(kernel.writes) == 3
    wanted = sum(1 for e in reports[-1].plan.entries if e.changes and not e.managed)
    assert wanted > 50 and reports[-1].moves == 0
    assert set(reports[-1].status.values()) >= {"unwritable"}

    failures = balancer.report()["failures"]
    assert failures["writable"] is False and failures["by_errno"] == {"EROFS": wanted}
    assert failures["permanent"] == wanted and "read-only" in failures["reason"]
    assert balancer.status_text() == (f"IRQ cycle 3 (continuous), 0 move(s), {wanted} IRQ(s) unsettable: "
                                      "/proc/irq read-only (EROFS)")
    health = balancer.health()
    assert health["mode"] == "continuous" and health["cycles"] == 3 and health["moves_total"] == 0
    assert health["unsettable"] == wanted and health["writable"] is False
    assert "read-only" in health["last_error"]


def test_a_writable_proc_irq_again_is_found_by_the_next_full_cycle(h800):
    root, host, topology = h800
    kernel = Kernel(host, refuse_all=errno.EROFS)
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    balancer.cycle(topology)
    kernel.refuse_all = None  # remounted read-write
    clock.advance(10)
    report = balancer.cycle(topology)
    assert [e["event"] for e in report.events].count("irq_writes_possible") == 1
    assert report.moves > 50 and delivered(root, _first_rdma_queue(root)) == [1]
    assert balancer.health()["writable"] is True and balancer.report()["failures"]["permanent"] == 0
    assert "unsettable" not in balancer.status_text()


def test_changed_settings_try_writing_again_and_say_so_once_more(h800):
    root, host, topology = h800
    kernel = Kernel(host, refuse_all=errno.EROFS)
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock())
    balancer.cycle(topology)
    balancer.cycle(topology)
    balancer.configure(IrqSettings(mode="continuous", min_gain=0.3))
    report = balancer.cycle(topology)
    assert [e["event"] for e in report.events] == ["irq_writes_impossible"]
    assert len(kernel.writes) == 3


@pytest.mark.parametrize("code", [errno.EXDEV, 999])
def test_an_errno_not_known_to_be_transient_is_permanent_for_that_irq(h800, code):
    root, host, topology = h800
    irq = _first_rdma_queue(root)
    kernel = Kernel(host, faults={irq: [code] * 5})
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    reports = [balancer.cycle(topology, {0})]
    for _ in range(3):
        clock.advance(3600)
        reports.append(balancer.cycle(topology, {0}))
    name = errno.errorcode.get(code, str(code))
    (event,) = _events(reports, "irq_unsettable")
    assert event["irq"] == irq and event["errno"] == name and "not transient" in event["reason"]
    assert not _events(reports, "irq_move_failed") and not _events(reports, "irq_writes_impossible")
    assert [i for i, _ in kernel.writes].count(irq) == 1, "an unknown errno was retried"
    assert reports[-1].status[irq] == "refused" and reports[0].moves > 50, "only that IRQ is given up"
    failures = balancer.report()["failures"]
    assert failures["by_errno"] == {name: 1} and failures["writable"] is True and failures["permanent"] == 1
    assert f"1 refused ({name})" in balancer.status_text()
    assert balancer.health()["unsettable"] == 1 and str(irq) in balancer.health()["last_error"]


def test_the_same_unknown_errno_on_every_write_is_one_summary_not_one_line_per_irq(h800):
    root, host, topology = h800
    kernel = Kernel(host, refuse_all=999)
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    reports = []
    for _ in range(3):
        reports.append(balancer.cycle(topology))
        clock.advance(3600)
    assert [e["event"] for e in _events(reports)] == ["irq_writes_impossible"]
    assert _events(reports)[0]["errno"] == "999"
    first = len([w for w in kernel.writes])
    assert first == sum(1 for e in reports[0].plan.entries if e.changes and not e.managed) + 2
    assert balancer.report()["failures"]["writable"] is False
    assert balancer.report()["failures"]["by_errno"] == {"999": first - 2}


def test_ebusy_is_still_retried_with_backoff_and_shows_as_last_error(h800):
    root, host, topology = h800
    irq = _first_rdma_queue(root)
    kernel = Kernel(host, faults={irq: [errno.EBUSY]})
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous", retry_base_seconds=10.0), clock=clock)
    first = balancer.cycle(topology, {0})
    (failed,) = _events([first], "irq_move_failed")
    assert failed["errno"] == "EBUSY" and failed["retry_in_seconds"] == 10.0
    assert balancer.health()["writable"] is True and "EBUSY" in balancer.health()["last_error"]
    assert balancer.report()["failures"]["retrying"] == 1 and "1 retrying" in balancer.status_text()
    clock.advance(11)
    assert balancer.cycle(topology, {0}).status[irq] == "moved"
    assert [i for i, _ in kernel.writes].count(irq) == 2


def test_a_verdict_drawn_from_two_irqs_does_not_hold_the_others_back_for_good(h800):
    root, host, topology = h800
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)
    Kernel(host)
    balancer.cycle(topology)
    # Steady; then someone moves two IRQs, and both answer the same odd errno when moved back.
    first, second = device_irqs(root, "rdma")[sorted(device_irqs(root, "rdma"))[0]][2:4]
    for irq in (first, second):
        (root / f"proc/irq/{irq}/smp_affinity_list").write_text("0-63\n")
    advance_interrupts(root, {first: 1, second: 1})  # they fire: their affinity is read again
    kernel = Kernel(host, faults={first: [999] * 9, second: [999] * 9})
    clock.advance(10)
    report = balancer.cycle(topology)
    assert [e["event"] for e in report.events] == ["irq_writes_impossible"] and len(kernel.writes) == 2
    # A third IRQ, writable, needs moving too: later full cycles probe one IRQ each, in turn.
    third = device_irqs(root, "rdma")[sorted(device_irqs(root, "rdma"))[1]][2]
    third_home = delivered(root, third)
    (root / f"proc/irq/{third}/smp_affinity_list").write_text("0-63\n")
    advance_interrupts(root, {third: 1})
    events = []
    for _ in range(4):
        clock.advance(10)
        events += balancer.cycle(topology).events
    names = [e["event"] for e in events]
    assert names.count("irq_writes_possible") == 1 and "irq_writes_impossible" not in names
    # The two that failed were the IRQs' own fault after all: refused one by one, once.
    assert sorted(e["irq"] for e in events if e["event"] == "irq_unsettable") == sorted((first, second))
    assert balancer.health()["writable"] is True and delivered(root, third) == third_home
    assert balancer.report()["failures"]["by_errno"] == {"999": 2}
    assert {irq for irq, _ in kernel.writes} == {first, second, third} and len(kernel.writes) <= 8
