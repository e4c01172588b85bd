"""Odd and broken host trees: never a crash, never an invented value, always a warning."""

import json
import os
import shutil

import pytest

from topod.discover import discover
from topod.errors import NotAHostTreeError
from topod.host import HostRoot


def _discover(root):
    return discover(HostRoot(root), live_nvml=False)


def _codes(topo):
    return {w.code for w in topo.warnings}



def _device_path(root, address):
    return root / "sys/bus/pci/devices" / address


def test_root_that_is_not_a_host_tree_gets_one_clear_error(tmp_path):
    with pytest.raises(NotAHostTreeError, match="not a host tree"):
        HostRoot(tmp_path)
    with pytest.raises(NotAHostTreeError, match="no such directory"):
        HostRoot(tmp_path / "missing")


def test_firmware_numa_minus_one_resolves_from_local_cpus_with_warning(host_tree):
    root = host_tree("h800-8gpu")
    address = _discover(root).gpu(5).address
    (_device_path(root, address) / "numa_node").write_text("-1\n")
    topo = _discover(root)
    device = topo.device(address)
    assert device.numa_node == 1 and device.numa_node_source == "local_cpus"
    assert any(w.code == "numa_from_local_cpus" and address in w.path for w in topo.warnings)


def test_no_locality_at_all_falls_back_to_the_upstream_bridge(host_tree):
    root = host_tree("h800-8gpu")
    address = _discover(root).gpu(6).address
    path = _device_path(root, address)
    (path / "numa_node").write_text("-1\n")
    (path / "local_cpulist").unlink()
    (path / "local_cpus").unlink()
    topo = _discover(root)
    assert topo.device(address).numa_node == 1
    assert topo.device(address).numa_node_source in ("ancestor", "local_cpus")
    assert topo.device(address).local_cpus == topo.node(1).cpus


def test_locality_spanning_every_node_is_unknown_not_guessed(host_tree):
    root = host_tree("h800-8gpu")
    topo = _discover(root)
    rc = topo.device(topo.gpu(0).address).root_complex
    for device in topo.pci_devices:
        if device.root_complex == rc:
            path = _device_path(root, device.address)
            (path / "numa_node").write_text("-1\n")
            (path / "local_cpulist").write_text("0-63\n")
    topo = _discover(root)
    assert topo.gpu(0).numa_node is None
    assert topo.device(topo.gpu(0).address).numa_node_source == "unknown"
    assert "numa_unknown" in _codes(topo)


def test_numa_node_naming_no_node_is_ignored_with_warning(host_tree):
    root = host_tree("h800-8gpu")
    address = _discover(root).gpu(0).address
    (_device_path(root, address) / "numa_node").write_text("7\n")
    topo = _discover(root)
    assert topo.device(address).numa_node == 0
    assert any("names no NUMA node" in w.reason for w in topo.warnings)


def test_garbage_values_are_skipped_and_reported_with_their_path(host_tree):
    root = host_tree("h800-8gpu")
    address = _discover(root).gpu(1).address
    (_device_path(root, address) / "class").write_text("banana\n")
    (root / "sys/devices/system/node/node1/distance").write_text("10 ten\n")
    (root / "sys/devices/system/cpu/isolated").write_text("x-y\n")
    topo = _discover(root)
    assert topo.device(address).class_code is None and topo.device(address).kind == "other"
    assert topo.node(1).distances == {1: 10}
    bad_paths = {w.path for w in topo.warnings if w.code == "bad_value"}
    assert any(p.endswith(f"{address}/class") for p in bad_paths)
    assert "sys/devices/system/node/node1/distance" in bad_paths
    assert "sys/devices/system/cpu/isolated" in bad_paths


def test_dangling_device_link_is_skipped_with_warning(host_tree):
    root = host_tree("pcie-8gpu")
    os.symlink("../../../devices/pci0000:99/0000:99:00.0", root / "sys/bus/pci/devices/0000:99:00.0")
    topo = _discover(root)
    assert topo.device("0000:99:00.0") is None
    assert "dangling_link" in _codes(topo)


def test_offline_cpus_are_kept_offline_and_out_of_node_cpu_lists(host_tree):
    root = host_tree("h800-8gpu")
    (root / "sys/devices/system/cpu/online").write_text("0-4,6-63\n")
    (root / "sys/devices/system/cpu/cpu5/online").write_text("0\n")
    topo = _discover(root)
    assert topo.cpu(5).online is False
    assert 5 not in topo.node(0).cpus and 5 in topo.node(0).listed_cpus


def test_isolated_and_nohz_full_cpus_are_marked(host_tree):
    root = host_tree("h800-8gpu")
    (root / "sys/devices/system/cpu/isolated").write_text("8-11\n")
    (root / "sys/devices/system/cpu/nohz_full").write_text("8-11\n")
    topo = _discover(root)
    assert topo.isolated_cpus == (8, 9, 10, 11) and topo.nohz_full_cpus == (8, 9, 10, 11)


def test_cpu_listed_by_no_node_is_reported_not_assigned(host_tree):
    root = host_tree("vm-nogpu")
    (root / "sys/devices/system/node/node0/cpulist").write_text("0-2\n")
    topo = _discover(root)
    assert topo.cpu(3).numa_node is None
    assert "cpu_without_node" in _codes(topo)


def test_memory_only_node_is_kept_marked_and_local_to_nearest_cpus(host_tree):
    root = host_tree("h800-8gpu")
    node = root / "sys/devices/system/node/node2"
    node.mkdir()
    (node / "cpulist").write_text("\n")
    (node / "distance").write_text("14 24 10\n")
    (node / "meminfo").write_text("Node 2 MemTotal: 1048576 kB\n")
    for other, row in ((0, "10 21 14"), (1, "21 10 24")):
        (root / f"sys/devices/system/node/node{other}/distance").write_text(row + "\n")
    topo = _discover(root)
    memory_node = topo.node(2)
    assert memory_node.cpus == () and not memory_node.has_cpus
    assert memory_node.local_cpus == topo.node(0).cpus
    assert memory_node.to_json()["memory_only"] is True


def test_sparse_and_huge_node_ids_are_kept_as_given(host_tree):
    root = host_tree("vm-nogpu")
    nodes = root / "sys/devices/system/node"
    shutil.move(nodes / "node0", nodes / "node4095")
    topo = _discover(root)
    assert [n.id for n in topo.numa_nodes] == [4095]
    assert topo.cpu(0).numa_node == 4095


def test_broken_nvml_json_is_ignored_with_warning_and_gpus_come_from_pci(host_tree):
    root = host_tree("h800-8gpu")
    (root / "nvml.json").write_text(json.dumps({"gpus": [{"index": "zero"}]}))
    topo = _discover(root)
    assert len(topo.gpus) == 8 and all(g.source == "sysfs" for g in topo.gpus)
    assert topo.nvlink.source == "none"
    assert {"bad_value", "gpu_index_from_pci_order"} <= _codes(topo)


def test_missing_nvml_json_means_no_nvlink_recorded_as_such(host_tree):
    root = host_tree("dgx1-cubemesh")
    (root / "nvml.json").unlink()
    topo = _discover(root)
    assert topo.nvlink.pairs == {} and "no_nvml" in _codes(topo)


def test_device_without_driver_is_normal(host_tree):
    root = host_tree("pcie-8gpu")
    address = _discover(root).gpu(0).address
    (_device_path(root, address) / "driver").unlink()
    topo = _discover(root)
    assert topo.device(address).driver is None and topo.device(address).kind == "gpu"


def test_degraded_pcie_link_is_visible(host_tree):
    root = host_tree("h800-8gpu")
    address = _discover(root).gpu(2).address
    (_device_path(root, address) / "current_link_width").write_text("8\n")
    assert _discover(root).device(address).link.degraded is True
