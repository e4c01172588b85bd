"""A write beneath a root never lands in a hard-linked file: `proc/irq/N/smp_affinity_list`
made a second name of a file outside the tree is refused (EMLINK), left byte for byte as
it was (not even truncated), and the IRQ is counted as a failed write once, never retried."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from irq_helpers import Clock, Kernel, built_host, device_irqs, irq_root

from topod import beneath
from topod.errors import HostWriteError
from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings

PRECIOUS = "keep me: the file outside the tree\n"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Both ways of resolving beneath the root (see test_irq_write_beneath)."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_openat2_state", {"fn": None, "available": False})
    else:
        monkeypatch.setattr(beneath, "_openat2_state", {})
        if beneath._syscall() is None:
            pytest.skip("no openat2 on this machine")
    return request.param


def _hard_link_outside(root: Path, rel: str, outside: Path) -> None:
    target = root / rel
    target.unlink()
    os.link(outside, target)


def _untouched(path: Path, before: os.stat_result) -> bool:
    after = os.stat(path)
    return path.read_text() == PRECIOUS and (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_hard_linked_affinity_file_is_refused_and_left_untouched(tmp_path, resolver):
    root = tmp_path / "host"
    (root / "proc/irq/30").mkdir(parents=True)
    (root / "proc/irq/30/smp_affinity_list").write_text("0-7\n")
    outside = tmp_path / "precious"
    outside.write_text(PRECIOUS)
    _hard_link_outside(root, "proc/irq/30/smp_affinity_list", outside)
    before = os.stat(outside)
    with pytest.raises(HostWriteError) as caught:
        HostRoot(root).write("proc/irq/30/smp_affinity_list", "3\n")
    assert caught.value.errno == errno.EMLINK
    assert "2 hard links" in str(caught.value) and "not written" in str(caught.value)
    assert _untouched(outside, before), "the file outside the root was changed (or truncated) through its link"


def test_open_beneath_refuses_a_hard_link_before_truncating(tmp_path, resolver):
    """O_TRUNC asked for, yet the refused file keeps its bytes: the check comes first."""
    (tmp_path / "root").mkdir()
    outside = tmp_path / "precious"
    outside.write_text(PRECIOUS)
    os.link(outside, tmp_path / "root/state")
    before = os.stat(outside)
    root_fd = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as caught:
            beneath.open_beneath(root_fd, "state", beneath.WRITE_FLAGS, use_openat2=resolver == "openat2")
    finally:
        os.close(root_fd)
    assert caught.value.errno == errno.EMLINK
    assert _untouched(outside, before)


def test_a_single_link_file_is_still_emptied_before_the_write(tmp_path, resolver):
    root = tmp_path / "host"
    (root / "proc/irq/30").mkdir(parents=True)
    (root / "proc/irq/30/smp_affinity_list").write_text("0-127,256-383\n")
    HostRoot(root).write("proc/irq/30/smp_affinity_list", "3\n")
    assert (root / "proc/irq/30/smp_affinity_list").read_text() == "3\n"


def test_hard_linked_affinity_file_is_one_counted_failure_never_retried(tmp_path, tmp_path_factory, resolver):
    built, topology = built_host(tmp_path_factory, "h800-8gpu")
    root = irq_root(built, tmp_path / "host")
    rdma = device_irqs(root, "rdma")
    irq = rdma[sorted(rdma)[0]][2]
    outside = tmp_path / "precious"
    outside.write_text(PRECIOUS)
    _hard_link_outside(root, f"proc/irq/{irq}/smp_affinity_list", outside)
    before = os.stat(outside)
    host = HostRoot(root)
    kernel = Kernel(host)
    clock = Clock()
    balancer = IrqBalancer(host, IrqSettings(mode="continuous"), clock=clock)

    first = balancer.cycle(topology)
    assert first.status[irq] == "refused"
    (event,) = [e for e in first.events if e["event"] == "irq_unsettable" and e["irq"] == irq]
    assert event["errno"] == "EMLINK"
    assert "hard links" in event["reason"] and "kernel" not in event["reason"].split(";")[0]
    assert balancer.failures.to_json()["by_errno"].get("EMLINK") == 1
    assert any(i != irq for i, _ in kernel.writes), "the other IRQs were not written"
    tried = sum(1 for i, _ in kernel.writes if i == irq)

    for _ in range(3):
        clock.now += 600  # past every backoff a retry could wait
        later = balancer.cycle(topology)
        assert not [e for e in later.events if e.get("irq") == irq and e["event"] in ("irq_unsettable",
                                                                                     "irq_move_failed")]
    assert sum(1 for i, _ in kernel.writes if i == irq) == tried, "the refused IRQ was written again"
    assert _untouched(outside, before)
    assert "refused (EMLINK)" in balancer.status_text() and balancer.health()["unsettable"] >= 1
