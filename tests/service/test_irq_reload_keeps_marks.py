"""A reload that changes [irq] (not its interval) reaches the running balancer in place:
what it learned stays. On a real kernel (the live tier) every `systemctl reload` used to
start a new balancer, which wrote each managed NVMe queue again, got EIO again and
announced it again; here an IRQ whose affinity file topod refuses to write (a symlink,
ELOOP) stands in for it."""

from __future__ import annotations

import json
import time

CONFIG = '[irq]\nmode = "continuous"\ninterval_seconds = 0.5\ncooldown_seconds = 0.0\n[probe]\nenabled = false\n'


def _wait_until(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _announced(daemon, irq: int) -> int:
    count = 0
    for line in daemon.log_path.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            count += record.get("event") == "irq_unsettable" and record.get("irq") == irq
    return count


def _a_moved_irq(root) -> int:
    """An RDMA completion vector: its class spreads, and every IRQ starts on CPU 0."""
    for line in (root / "proc/interrupts").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[0].rstrip(":").isdigit() and fields[-1].startswith("mlx5_comp3@"):
            return int(fields[0].rstrip(":"))
    raise AssertionError("no mlx5_comp3 vector in the fixture")


def test_a_reload_changing_irq_settings_keeps_the_balancers_marks_and_worker(daemon_factory, host_tree):
    root = host_tree("h800-8gpu")
    for affinity in (root / "proc/irq").glob("*/smp_affinity_list"):
        affinity.write_text("0\n")
    irq = _a_moved_irq(root)
    target = root / "elsewhere"
    target.write_text("0\n")
    refused = root / f"proc/irq/{irq}/smp_affinity_list"
    refused.unlink()
    refused.symlink_to(target)

    daemon = daemon_factory(root=root, config=CONFIG)
    client = daemon.start()
    _wait_until(lambda: _announced(daemon, irq) == 1)
    worker = client.health()["irq"]["worker"]
    cycles = client.health()["irq"]["cycles"]

    daemon.config_path.write_text(CONFIG.replace("cooldown_seconds = 0.0", "cooldown_seconds = 0.0\nmin_gain = 0.3"))
    assert client.request("POST", "/v1/reload")["applied"] is True
    _wait_until(lambda: client.health()["irq"]["cycles"] >= cycles + 3)

    after = client.health()["irq"]
    assert after["worker"] == worker, "the reload started another IRQ worker"
    assert _announced(daemon, irq) == 1, "the refused IRQ was written and announced again after the reload"
    assert after["unsettable"] >= 1
    assert target.read_text() == "0\n"  # never written through the link


def test_a_reload_changing_the_interval_still_starts_a_fresh_loop(daemon_factory, host_tree):
    daemon = daemon_factory(root=host_tree("h800-8gpu"), config=CONFIG)
    client = daemon.start()
    worker = _wait_until(lambda: client.health()["irq"]["worker"]["pid"])
    daemon.config_path.write_text(CONFIG.replace("interval_seconds = 0.5", "interval_seconds = 0.7"))
    assert client.request("POST", "/v1/reload")["applied"] is True
    _wait_until(lambda: client.health()["irq"]["worker"]["pid"] not in (None, worker))
