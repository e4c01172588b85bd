"""topod's udev adapter against a real umockdev testbed (libudev + netlink, preloaded).

One child process (umockdev-wrapper + Debian's Python with gi) runs every scenario of
umockdev_helpers.py, each in a fresh testbed loaded from a built host tree; the tests
assert on what it reports. These run in CI: a missing umockdev is a failure, not a skip,
unless TOPOD_SKIP_UMOCKDEV=1 says the machine cannot have it.
"""

from __future__ import annotations

import json
import os

import pytest

from topod.hostspec import build_host
from umockdev_helpers import UmockdevUnavailable, run_scenarios

SPEC = {
    "name": "udev-small",
    "pcie_gen": 5,
    "cpu": {"sockets": 1, "cores_per_socket": 4, "threads_per_core": 1, "memory_gib_per_node": 16},
    "root_complex": [{"node": 0, "switches": [{"devices": ["gpu", "rdma"]}], "devices": ["nvme"]}],
}
GPU, RDMA, NVME = "0000:13:00.0", "0000:14:00.0", "0000:15:00.0"
SCENARIOS = ["enumerate", "cross_check_clean", "cross_check_injected", "hotplug_add", "hotplug_remove",
             "daemon_hotplug"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory):
    return build_host(SPEC, tmp_path_factory.mktemp("udev") / "tree")


@pytest.fixture(scope="module")
def results(tree, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    try:
        return run_scenarios(tree, SCENARIOS, tmp_path_factory.mktemp("umockdev"))
    except UmockdevUnavailable as exc:
        if os.environ.get("TOPOD_SKIP_UMOCKDEV") == "1":
            pytest.skip(f"TOPOD_SKIP_UMOCKDEV=1: {exc}")
        pytest.fail(f"umockdev tests cannot run: {exc}")


def scenario(results: dict[str, dict], name: str) -> dict:
    result = results[name]
    assert result["ok"], f"scenario {name} raised in the umockdev child:\n{result.get('error')}"
    return result


def by_path_tail(devices: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["subsystem"], d["sys_name"]): d for d in devices}


def test_fixture_places_gpu_rdma_and_nvme_where_these_tests_expect(tree):
    facts = json.loads((tree / "topod-fixture.json").read_text())["devices"]
    assert (facts[GPU]["kind"], facts[RDMA]["kind"], facts[NVME]["kind"]) == ("gpu", "rdma", "nvme")


def test_udev_lists_the_gpu_with_ids_driver_and_numa_node_from_attributes(results):
    devices = by_path_tail(scenario(results, "enumerate")["devices"])
    gpu = devices[("pci", GPU)]
    assert (gpu["vendor"], gpu["device"], gpu["class_code"]) == (0x10DE, 0x2324, 0x030200)
    assert (gpu["driver"], gpu["numa_node"], gpu["address"]) == ("nvidia", 0, GPU)
    assert gpu["sys_path"].endswith(f"/0000:12:00.0/{GPU}")


def test_udev_lists_the_mlx5_nic_with_its_infiniband_and_net_children(results):
    devices = by_path_tail(scenario(results, "enumerate")["devices"])
    nic = devices[("pci", RDMA)]
    assert (nic["vendor"], nic["class_code"], nic["driver"]) == (0x15B3, 0x020700, "mlx5_core")
    assert devices[("infiniband", "mlx5_0")]["address"] == RDMA
    assert devices[("net", "ibp0s0")]["address"] == RDMA


def test_udev_lists_the_nvme_controller_under_its_function(results):
    devices = by_path_tail(scenario(results, "enumerate")["devices"])
    assert devices[("pci", NVME)]["driver"] == "nvme"
    assert devices[("nvme", "nvme0")]["address"] == NVME


def test_udev_lists_exactly_the_functions_the_tree_was_built_with(results, tree):
    facts = json.loads((tree / "topod-fixture.json").read_text())["devices"]
    pci = [d["address"] for d in scenario(results, "enumerate")["devices"] if d["subsystem"] == "pci"]
    assert sorted(pci) == sorted(facts)


def test_cross_check_on_a_consistent_live_root_is_used_and_finds_nothing(results, tree):
    result = scenario(results, "cross_check_clean")
    assert result["live"] and result["used"]
    assert result["findings"] == []
    facts = json.loads((tree / "topod-fixture.json").read_text())["devices"]
    assert result["pci_functions"] == sorted(facts)  # discovery saw the testbed, not this machine
    assert result["status"] == "udev: 8 PCI functions and 4 children cross-checked, 0 mismatch(es)"


def test_cross_check_reports_each_injected_mismatch_against_a_stale_topology(results):
    stale = {f["path"]: f for f in scenario(results, "cross_check_injected")["stale"]}
    assert {f["code"] for f in stale.values()} == {"udev_mismatch"}
    assert set(stale) == {f"sys/bus/pci/devices/{a}" for a in ("0000:7f:00.0", NVME, GPU)}
    assert "udev lists PCI function 0000:7f:00.0" in stale["sys/bus/pci/devices/0000:7f:00.0"]["reason"]
    assert "udev does not list it" in stale[f"sys/bus/pci/devices/{NVME}"]["reason"]
    assert "numa_node is 0 in sysfs discovery but 1 in udev" in stale[f"sys/bus/pci/devices/{GPU}"]["reason"]


def test_rediscovery_clears_stale_mismatches_and_agrees_on_a_function_outside_host_bridges(results):
    # 0000:7f:00.0 sits outside any pciDDDD:BB host bridge: discovery now reports it (with an
    # unexpected_path warning) instead of skipping it, so udev and sysfs agree once rediscovered.
    result = scenario(results, "cross_check_injected")
    assert "sys/bus/pci/devices/0000:7f:00.0" in {f["path"] for f in result["stale"]}
    assert result["fresh"] == []


def test_hot_added_pci_functions_arrive_as_add_events_with_their_address(results):
    events = scenario(results, "hotplug_add")["events"]
    assert [(e["action"], e["subsystem"], e["address"]) for e in events] == [
        ("add", "pci", "0000:60:01.0"),
        ("add", "pci", "0000:61:00.0"),
    ]
    assert events[1]["sys_path"] == "/sys/devices/pci0000:60/0000:60:01.0/0000:61:00.0"


def test_a_hot_add_asks_for_one_rebuild_only_after_the_quiet_period(results):
    result = scenario(results, "hotplug_add")
    assert result["request_before_quiet"] is None
    request = result["request_after_quiet"]
    assert request["events"] == 2 and request["actions"] == ["add"]
    assert request["addresses"] == ["0000:60:01.0", "0000:61:00.0"]


def test_a_burst_for_one_rdma_hot_plug_yields_exactly_one_rebuild(results):
    result = scenario(results, "hotplug_add")
    burst = result["burst_request"]
    assert burst is not None, "wait_for_change returned nothing for a four-event burst"
    assert burst["events"] == 4 and burst["actions"] == ["add", "change"]
    assert burst["addresses"] == ["0000:61:00.1"]  # infiniband and net children map to their function
    assert result["after_burst"] is None


def test_a_removed_nic_arrives_as_a_remove_event_and_one_rebuild(results):
    result = scenario(results, "hotplug_remove")
    assert [(e["action"], e["subsystem"], e["address"]) for e in result["events"]] == [("remove", "pci", RDMA)]
    assert result["request"]["actions"] == ["remove"] and result["request"]["addresses"] == [RDMA]
    assert result["still_listed"] is False


def test_the_daemon_watches_udev_on_a_live_root_and_rediscovers_once_per_burst(results):
    result = scenario(results, "daemon_hotplug")
    assert result["active"] and result["hotplug"]["active"], result["hotplug"]
    assert result["hotplug"]["mode"].startswith("udev: watching")
    added, removed = result["events"][0], result["events"][1]
    assert added["gpus_added"] == ["0000:61:00.0"] and result["devices_added"] == result["devices_before"] + 2
    assert result["changes_after_add"] == 1, "two add events (bridge + GPU) make one rediscovery"
    assert removed["gpus_removed"] == ["0000:61:00.0"] and result["devices_removed"] == result["devices_added"] - 1
    assert len(result["events"]) == 2

