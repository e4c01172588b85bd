"""What the daemon does with its defaults and as its config and host set it: started with
defaults it is ready, balances IRQs and says probes are off on a captured tree; SIGHUP
switches the IRQ loop and probes off and on; on the live root hot-plug comes from udev;
in a container IRQ balancing only plans unless allowed; a lease pins CPUs by default and
reserved_cpus_per_node keeps each node's first cores out of leases."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.service.daemon_scenario import _wait_until, scenarios


@pytest.fixture()
def scenario(daemon_factory, tmp_path):
    yield from scenarios(daemon_factory, tmp_path)


def test_started_with_defaults_the_daemon_is_ready_balances_irqs_and_reports_probes_off(scenario):
    s = scenario()
    assert any("READY=1" in text for _, text in s.notify.messages)
    assert _wait_until(lambda: set(s.client.health()["loops"]) >=
                       {"reaper", "rescan", "irq", "probe", "api", "load", "exports"})
    health = s.check()
    assert health["hotplug"]["active"] is False, "a captured tree has no udev"
    links = _wait_until(lambda: (answer := s.client.request("GET", "/v1/links")).get("starting") is None and answer)
    assert links["enabled"] is False and "captured tree" in links["reason"]
    assert "no link probes" in s.daemon.log(), "the host_access line says so too"
    assert _wait_until(lambda: s.client.request("GET", "/v1/irqs").get("cycles", 0) >= 1 or
                       s.client.health()["irq"].get("cycles", 0) >= 1)


def test_sighup_switches_the_irq_loop_and_probes_off_and_on(scenario):
    s = scenario(config="")
    s.daemon.config_path.write_text('[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    s.daemon.process.send_signal(signal.SIGHUP)
    assert _wait_until(lambda: "irq" not in s.client.health()["loops"] and "probe" not in s.client.health()["loops"])
    assert s.client.request("GET", "/v1/irqs")["mode"] == "off"
    lease = s.allocate(1)
    s.check()
    s.daemon.config_path.write_text('[irq]\nmode = "dry-run"\ninterval_seconds = 1.0\n')
    s.daemon.process.send_signal(signal.SIGHUP)
    assert _wait_until(lambda: {"irq", "probe"} <= set(s.client.health()["loops"]))
    assert _wait_until(lambda: s.client.health()["irq"].get("cycles", 0) >= 2, timeout=10), "interval applies"
    assert s.client.request("GET", "/v1/irqs")["mode"] == "dry-run"
    assert [l["id"] for l in s.client.leases()] == [lease["id"]]
    s.check()


def test_on_the_live_root_the_hotplug_source_is_udev(daemon_factory, tmp_path):
    # Read-only on this machine: IRQ balancing off, no probes.
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n', root=Path("/"))
    client = daemon.start(timeout=30)
    hotplug = _wait_until(lambda: (h := client.health()["hotplug"])["mode"] != "starting" and h)
    assert hotplug["active"] is True and hotplug["mode"].startswith("udev: watching"), hotplug
    assert client.request("GET", "/v1/irqs")["mode"] == "off"


def test_in_a_container_continuous_irq_balancing_only_plans(daemon_factory, host_tree):
    root = host_tree("h800-8gpu")
    (root / "run/systemd").mkdir(parents=True, exist_ok=True)
    (root / "run/systemd/container").write_text("systemd-nspawn\n")
    before = {p.name: (p / "smp_affinity_list").read_text() for p in (root / "proc/irq").iterdir() if p.name.isdigit()}
    daemon = daemon_factory(config='[irq]\nmode = "continuous"\ninterval_seconds = 0.5\n[probe]\nenabled = false\n',
                            root=root)
    client = daemon.start()
    assert _wait_until(lambda: client.health()["irq"].get("cycles", 0) >= 2)
    health = client.health()
    assert health["container"] == "systemd-nspawn" and "allow_in_container" in health["irq"]["withheld"]
    irqs = client.request("GET", "/v1/irqs")
    assert irqs["mode"] == "dry-run" and "container" in irqs["withheld"]
    after = {p.name: (p / "smp_affinity_list").read_text() for p in (root / "proc/irq").iterdir() if p.name.isdigit()}
    assert after == before, "nothing written from inside a container"
    assert "host_access" in daemon.log() and "plans IRQ affinity but writes nothing" in daemon.log()


def test_a_container_that_allows_it_does_write(daemon_factory, host_tree):
    root = host_tree("h800-8gpu")
    (root / "run/systemd").mkdir(parents=True, exist_ok=True)
    (root / "run/systemd/container").write_text("docker\n")
    daemon = daemon_factory(config='[irq]\nmode = "continuous"\nallow_in_container = true\n'
                                   '[probe]\nenabled = false\n', root=root)
    client = daemon.start()
    assert _wait_until(lambda: client.health()["irq"].get("moves_total", 0) > 0), client.health()["irq"]
    assert client.health()["irq"]["withheld"] is None


def test_a_lease_pins_cpus_by_default(scenario):
    s = scenario()
    lease = s.allocate(2)
    assert len(lease["cpus"]) == 12, "two GPUs x their node's fair share (3 cores, 6 CPUs)"
    assert all(len(p["cpus"]) == 6 for p in lease["placements"])
    gpu_cpus = lease["environment"]["TOPOD_GPU_CPUS"]
    assert all(part.split(":")[1] for part in gpu_cpus.split(";")), gpu_cpus
    s.check()


def test_reserved_cpus_per_node_keeps_each_nodes_first_cores_out_of_leases(daemon_factory):
    daemon = daemon_factory(config='[alloc]\nreserved_cpus_per_node = 2\n[probe]\nenabled = false\n')
    client = daemon.start()
    topology = client.topology()
    first = {cpu for node in topology["numa_nodes"] for cpu in sorted(node["cpus"])[:2]}
    siblings = {s for cpu in topology["cpus"] if cpu["id"] in first for s in cpu["siblings"]}
    held = {cpu for lease in [client.allocate(4), client.allocate(4)] for cpu in lease["cpus"]}
    assert held and not held & (first | siblings), sorted(held & (first | siblings))
