"""IRQ writes stay inside the root: no link below it is followed (the file itself or a
directory on the way), no FIFO blocks a write, and a refused write is a permanent failure
for that IRQ, never a crash (issue 25, row 7)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from irq_helpers import Clock, Kernel, built_host, device_irqs, irq_root

from topod import beneath
from topod.errors import HostWriteError
from topod.host import HostRoot
from topod.irq import IrqBalancer, IrqSettings


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Both ways of resolving beneath the root: openat2 (when this kernel has it) and the
    per-component O_NOFOLLOW walk used where it answers ENOSYS."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_openat2_state", {"fn": None, "available": False})
    else:
        monkeypatch.setattr(beneath, "_openat2_state", {})
        if beneath._syscall() is None:
            pytest.skip("no openat2 on this machine")
    return request.param


@pytest.fixture()
def tree(tmp_path: Path) -> tuple[Path, Path, HostRoot]:
    root = tmp_path / "host"
    (root / "proc/irq/30").mkdir(parents=True)
    (root / "proc/irq/30/smp_affinity_list").write_text("0-7\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me\n")
    return root, outside, HostRoot(root)


def test_a_write_lands_in_the_regular_file_below_the_root(tree, resolver):
    root, _, host = tree
    host.write("proc/irq/30/smp_affinity_list", "3\n")
    assert (root / "proc/irq/30/smp_affinity_list").read_text() == "3\n"


def test_affinity_file_symlinked_outside_the_root_is_not_followed(tree, resolver):
    root, outside, host = tree
    target = root / "proc/irq/30/smp_affinity_list"
    target.unlink()
    target.symlink_to(outside / "precious")
    with pytest.raises(HostWriteError) as caught:
        host.write("proc/irq/30/smp_affinity_list", "3\n")
    assert caught.value.errno == errno.ELOOP and "symbolic link" in str(caught.value)
    assert (outside / "precious").read_text() == "keep me\n"


def test_symlinked_directory_component_is_not_followed(tree, resolver):
    root, outside, host = tree
    (outside / "irq").mkdir()
    (outside / "irq/smp_affinity_list").write_text("0-7\n")
    (root / "proc/irq/31").symlink_to(outside / "irq")
    with pytest.raises(HostWriteError) as caught:
        host.write("proc/irq/31/smp_affinity_list", "3\n")
    assert caught.value.errno == errno.ELOOP
    assert (outside / "irq/smp_affinity_list").read_text() == "0-7\n"
    # a relative link inside the root is refused too: links are not followed anywhere below it
    (root / "proc/irq/32").symlink_to("30")
    with pytest.raises(HostWriteError):
        host.write("proc/irq/32/smp_affinity_list", "3\n")
    assert (root / "proc/irq/30/smp_affinity_list").read_text() == "0-7\n"


def test_dot_dot_does_not_climb_out_of_the_root(tree, resolver):
    _, outside, host = tree
    with pytest.raises(HostWriteError) as caught:
        host.write("proc/../../outside/precious", "3\n")
    assert caught.value.errno == errno.EXDEV
    assert (outside / "precious").read_text() == "keep me\n"


def _write_in_thread(host: HostRoot, rel: str) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            host.write(rel, "3\n")
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5.0)
    return thread, errors


def test_fifo_in_place_of_the_affinity_file_does_not_block(tree, resolver):
    root, _, host = tree
    target = root / "proc/irq/30/smp_affinity_list"
    target.unlink()
    os.mkfifo(target)
    thread, errors = _write_in_thread(host, "proc/irq/30/smp_affinity_list")
    if thread.is_alive():  # unblock the stuck writer so the session can end
        os.close(os.open(target, os.O_RDONLY | os.O_NONBLOCK))
        pytest.fail("the write blocked on a FIFO")
    (error,) = errors
    assert isinstance(error, HostWriteError) and error.errno == errno.ENXIO


def test_fifo_with_a_reader_is_refused_unwritten(tree, resolver):
    root, _, host = tree
    target = root / "proc/irq/30/smp_affinity_list"
    target.unlink()
    os.mkfifo(target)
    reader = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
    try:
        thread, errors = _write_in_thread(host, "proc/irq/30/smp_affinity_list")
        assert not thread.is_alive()
        (error,) = errors
        assert isinstance(error, HostWriteError) and error.errno == errno.ENXIO
        assert "regular file" in str(error)
        assert os.read(reader, 16) == b""  # nothing was written into it
    finally:
        os.close(reader)


def test_refused_write_is_a_permanent_failure_of_that_irq_not_a_crash(tmp_path, tmp_path_factory, resolver):
    built, topology = built_host(tmp_path_factory, "h800-8gpu")
    root = irq_root(built, tmp_path / "host")
    rdma = device_irqs(root, "rdma")
    irq = rdma[sorted(rdma)[0]][2]
    outside = tmp_path / "precious"
    outside.write_text("keep me\n")
    target = root / f"proc/irq/{irq}/smp_affinity_list"
    target.unlink()
    target.symlink_to(outside)
    host = HostRoot(root)
    kernel = Kernel(host)
    report = IrqBalancer(host, IrqSettings(mode="continuous"), clock=Clock()).cycle(topology)
    assert outside.read_text() == "keep me\n"
    assert report.status[irq] == "refused"
    (event,) = [e for e in report.events if e["event"] == "irq_unsettable" and e["irq"] == irq]
    assert event["errno"] == "ELOOP"
    assert any(i != irq for i, _ in kernel.writes)  # the other IRQs were still written
