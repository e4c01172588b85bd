"""Odd and broken host trees: never a crash, never an invented value, always a warning."""

import errno
import json
import os
import shutil
import time

import pytest

from topod.cpulist import parse_cpulist
from topod.discover import discover
from topod.errors import NotAHostTreeError
from topod.host import HostRoot
from timebox import within as _within


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


def test_cpu_bitmap_files_ending_in_a_nul_read_as_the_kernel_meant_them(host_tree):
    """Some kernels print node cpulist/cpumap and the per-CPU topology lists as binary
    attributes ending in "\\n\\0" (seen on a real 128-core Arm host): the same host,
    no warning, not a fallback per file."""
    root = host_tree("h800-8gpu")
    before = _discover(root)
    padded = [*root.glob("sys/devices/system/node/node*/cpu*"),
              *root.glob("sys/devices/system/cpu/cpu*/topology/*_list"),
              *root.glob("sys/devices/system/cpu/cpu*/topology/*_siblings"),
              *root.glob("sys/devices/system/cpu/cpu*/topology/*_cpus")]
    padded = [path for path in padded if path.is_file() and path.name != "cpu_capacity"]
    assert len(padded) > 100
    for path in padded:
        path.write_bytes(path.read_bytes().rstrip(b"\n") + b"\n\x00")
    after = _discover(root)
    assert after.warnings == before.warnings
    assert after.numa_nodes == before.numa_nodes and after.cpus == before.cpus


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


def test_nodes_listing_cpus_of_an_earlier_node_are_left_out_with_a_warning(host_tree):
    # Real firmware does this (hwloc's 8em64t-2s2ca2c-buggynuma: CPUs 0-7 under each of
    # 8 nodes, each claiming the whole memory); hwloc keeps the first node listing a CPU.
    root = host_tree("h800-8gpu")
    nodes = root / "sys/devices/system/node"
    first = (nodes / "node0/cpulist").read_text()
    second = parse_cpulist((nodes / "node1/cpulist").read_text())
    (nodes / "node1/cpulist").write_text("0-63\n")
    topo = _discover(root)
    assert [node.id for node in topo.numa_nodes] == [0]
    assert topo.node(0).distances == {0: 10}  # no distance to a node left out
    assert topo.node(0).cpus == tuple(topo.cpu(c).id for c in topo.node(0).cpus)
    overlap = _warnings(topo, "numa_cpus_overlap")
    assert [w.path for w in overlap] == ["sys/devices/system/node/node1/cpulist"]
    assert f"CPUs {first.strip()} are also listed by node(s) 0" in overlap[0].reason
    # every CPU counted once: those only node 1 listed have no node, and say so
    counted = [cpu for node in topo.numa_nodes for cpu in node.cpus]
    assert len(counted) == len(set(counted))
    assert second and all(topo.cpu(c).numa_node is None for c in second)
    assert "cpu_without_node" in _codes(topo)
    # GPUs whose firmware names the node left out fall back to their own locality
    assert all(gpu.numa_node in (0, None) for gpu in topo.gpus)


def test_package_id_the_kernel_does_not_know_is_none_not_a_package_minus_one(host_tree):
    # POWER and s390 kernels write -1 (hwloc's 256ppc-8n8s4t and 20s390 trees)
    root = host_tree("h800-8gpu")
    (root / "sys/devices/system/cpu/cpu3/topology/physical_package_id").write_text("-1\n")
    topo = _discover(root)
    assert topo.cpu(3).package is None and topo.cpu(3).to_json()["package"] is None
    assert topo.cpu(2).package == 0


def test_kernels_with_only_cpu_masks_still_give_siblings_and_llc(host_tree):
    # Older kernels have topology/thread_siblings and cache/indexN/shared_cpu_map, not the
    # *_list files (hwloc's 16em64t, 96em64t and 256ia64 trees): without them every
    # hyper-thread looked like a core of its own and no CPU had an LLC.
    root = host_tree("h800-8gpu")
    expected = _discover(root)
    cpu_dir = root / "sys/devices/system/cpu"
    for topology in cpu_dir.glob("cpu*/topology"):
        siblings = parse_cpulist((topology / "thread_siblings_list").read_text())
        (topology / "thread_siblings").write_text(_mask(siblings))
        (topology / "thread_siblings_list").unlink()
        (topology / "core_cpus_list").unlink()
    for index in cpu_dir.glob("cpu*/cache/index*"):
        shared = parse_cpulist((index / "shared_cpu_list").read_text())
        (index / "shared_cpu_map").write_text(_mask(shared))
        (index / "shared_cpu_list").unlink()
    topo = _discover(root)
    assert topo.cpu(0).siblings == (0, 32) == expected.cpu(0).siblings
    assert [(c.siblings, c.llc) for c in topo.cpus] == [(c.siblings, c.llc) for c in expected.cpus]
    assert topo.cpu(40).llc == 0 and topo.cpu(16).llc == 16


def test_a_garbage_sibling_mask_is_a_warning_and_the_cpu_its_own_core(host_tree):
    root = host_tree("h800-8gpu")
    topology = root / "sys/devices/system/cpu/cpu3/topology"
    for name in ("thread_siblings_list", "core_cpus_list"):
        (topology / name).unlink()
    (topology / "thread_siblings").write_text("zz,not-a-mask\n")
    topo = _discover(root)
    assert topo.cpu(3).siblings == (3,)
    assert any(w.code == "bad_value" and w.path.endswith("cpu3/topology/thread_siblings") for w in topo.warnings)


def _mask(cpus):
    """A kernel bitmap ('00000000,00000101'): 32-bit words, highest first."""
    value = sum(1 << cpu for cpu in cpus)
    words = [(value >> shift) & 0xFFFFFFFF for shift in range(0, max(cpus) + 1, 32)] or [0]
    return ",".join(f"{word:08x}" for word in reversed(words)) + "\n"


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


# ---------------------------------------------------------------- hostile input


def _warnings(topo, code):
    return [w for w in topo.warnings if w.code == code]


def test_huge_online_cpulist_is_out_of_range_and_per_cpu_flags_are_used(host_tree):
    root = host_tree("vm-nogpu")
    (root / "sys/devices/system/cpu/online").write_text("0-4294967295\n")
    started = time.perf_counter()
    topo = _discover(root)
    assert time.perf_counter() - started < 5
    assert [c.id for c in topo.cpus if c.online] == [0, 1, 2, 3]
    [warning] = _warnings(topo, "cpulist_out_of_range")
    assert warning.path == "sys/devices/system/cpu/online" and "4294967295" in warning.reason


def test_cpu_lists_beyond_the_possible_cpus_are_ignored(host_tree):
    root = host_tree("h800-8gpu")
    address = _discover(root).gpu(0).address
    (root / "sys/devices/system/cpu/possible").write_text("0-63\n")
    (_device_path(root, address) / "local_cpulist").write_text("0-64\n")
    (_device_path(root, address) / "numa_node").write_text("-1\n")
    (root / "sys/devices/system/node/node1/cpulist").write_text("0-99999\n")
    (root / "sys/devices/system/node/node1/cpumap").write_text("ffff0000,ffff0000\n")
    topo = _discover(root)
    paths = {w.path for w in _warnings(topo, "cpulist_out_of_range")}
    assert any(p.endswith(f"{address}/local_cpulist") for p in paths)
    assert "sys/devices/system/node/node1/cpulist" in paths
    assert topo.node(1).cpus == tuple(range(16, 32)) + tuple(range(48, 64))  # from cpumap
    assert topo.device(address).numa_node == 0  # from the local_cpus mask instead


def test_giant_local_cpus_mask_is_out_of_range_not_expanded(host_tree):
    root = host_tree("h800-8gpu")
    address = _discover(root).gpu(3).address
    path = _device_path(root, address)
    (path / "local_cpulist").unlink()
    (path / "local_cpus").write_text(",".join(["ffffffff"] * 30_000) + "\n")
    started = time.perf_counter()
    topo = _discover(root)
    assert time.perf_counter() - started < 5
    assert any(w.path.endswith(f"{address}/local_cpus") for w in _warnings(topo, "cpulist_out_of_range"))
    assert topo.device(address).numa_node == 0  # firmware numa_node still holds


def test_fifo_in_the_tree_is_skipped_with_a_warning_not_waited_on(host_tree):
    root = host_tree("h800-8gpu")
    meminfo = root / "sys/devices/system/node/node0/meminfo"
    meminfo.unlink()
    os.mkfifo(meminfo)
    (root / "nvml.json").unlink()
    os.mkfifo(root / "nvml.json")
    with _within(10):
        topo = _discover(root)
    paths = {w.path for w in _warnings(topo, "not_a_regular_file")}
    assert paths == {"sys/devices/system/node/node0/meminfo", "nvml.json"}
    assert topo.node(0).memory_bytes is None and len(topo.gpus) == 8


def test_directory_where_a_file_belongs_is_a_warning(host_tree):
    root = host_tree("pcie-8gpu")
    address = _discover(root).gpu(0).address
    (_device_path(root, address) / "class").unlink()
    (_device_path(root, address) / "class").mkdir()
    topo = _discover(root)
    assert any(w.path.endswith(f"{address}/class") for w in _warnings(topo, "not_a_regular_file"))
    assert topo.device(address).class_code is None


def test_one_gib_sparse_file_is_refused_fast_with_a_warning(host_tree):
    root = host_tree("h800-8gpu")
    os.truncate(root / "nvml.json", 1 << 30)
    started = time.perf_counter()
    topo = _discover(root)
    assert time.perf_counter() - started < 5
    [warning] = _warnings(topo, "file_too_large")
    assert warning.path == "nvml.json" and "1073741824 bytes" in warning.reason
    assert all(g.source == "sysfs" for g in topo.gpus)


def test_permission_denied_becomes_its_own_warning(host_tree, monkeypatch):
    # Tests run as root, which chmod 000 does not stop: the kernel's EACCES is simulated.
    root = host_tree("h800-8gpu")
    real_open = os.open

    def deny(path, flags, *args, **kwargs):
        if str(path).endswith(("node1/distance", "cpu0/topology/core_id")):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    topo = _discover(root)
    denied = {w.path: w for w in _warnings(topo, "permission_denied")}
    assert set(denied) == {"sys/devices/system/node/node1/distance", "sys/devices/system/cpu/cpu0/topology/core_id"}
    assert all(w.to_json().keys() == {"code", "path", "reason"} for w in denied.values())
    assert topo.node(1).distances == {1: 10} and topo.cpu(0).core is None


def test_io_error_becomes_a_read_error_warning(host_tree, monkeypatch):
    root = host_tree("vm-nogpu")
    real_read = os.read

    def eio_on_meminfo(fd, size):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("node0/meminfo"):
            raise OSError(errno.EIO, "Input/output error")
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", eio_on_meminfo)
    topo = _discover(root)
    assert [w.path for w in _warnings(topo, "read_error")] == ["sys/devices/system/node/node0/meminfo"]


def test_symlink_loops_are_warnings_and_do_not_recurse(host_tree):
    root = host_tree("pcie-8gpu")
    siblings = root / "sys/devices/system/cpu/cpu1/topology/thread_siblings_list"
    siblings.unlink()
    os.symlink("thread_siblings_list", siblings)
    # Without bus/pci/devices the PCI tree is walked: a link back up must not be followed.
    shutil.rmtree(root / "sys/bus/pci/devices")
    top = next((root / "sys/devices").glob("pci0000:*"))
    first = next(p for p in sorted(top.iterdir()) if p.is_dir() and ":" in p.name and "." in p.name)
    os.symlink("..", first / "0000:ff:1f.7")
    with _within(20):
        topo = _discover(root)
    assert "sys/devices/system/cpu/cpu1/topology/thread_siblings_list" in {w.path for w in _warnings(topo, "read_error")}
    assert topo.device("0000:ff:1f.7") is None and len(topo.gpus) == 8


def test_deeply_nested_or_mistyped_nvml_json_is_a_bad_value(host_tree):
    root = host_tree("dgx1-cubemesh")
    (root / "nvml.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "bad_value" in _codes(_discover(root))
    (root / "nvml.json").write_text(json.dumps({"gpus": [{"index": 0, "pci_bus_id": "0000:01:00.0", "nvlinks": 5}]}))
    topo = _discover(root)
    assert any(w.path == "nvml.json" and "nvlinks" in w.reason for w in _warnings(topo, "bad_value"))


def test_no_cpus_because_unreadable_is_one_clear_error(host_tree):
    root = host_tree("vm-nogpu")
    cpu_dir = root / "sys/devices/system/cpu"
    shutil.rmtree(cpu_dir)
    cpu_dir.mkdir()
    os.mkfifo(cpu_dir / "online")
    with pytest.raises(NotAHostTreeError, match=r"online: a FIFO where a file was expected"):
        _discover(root)


def test_duplicate_gpu_index_in_nvml_json_is_a_warning_and_the_later_gpu_is_not_offered(host_tree):
    from topod.topojson import topology_to_json

    root = host_tree("h800-8gpu")
    before = _discover(root).nvlink.island_links
    data = json.loads((root / "nvml.json").read_text())
    data["gpus"][5]["index"] = 2  # two entries say "GPU 2"; the one later in the file loses
    dropped = data["gpus"][5]["pci_bus_id"].lower()[-12:]
    (root / "nvml.json").write_text(json.dumps(data))
    topo = _discover(root)
    assert sorted(g.index for g in topo.gpus) == [0, 1, 2, 3, 4, 6, 7]
    assert dropped not in {g.address for g in topo.gpus}  # not merged into GPU 2, not renumbered
    assert topo.gpu(2).address == data["gpus"][2]["pci_bus_id"].lower()[-12:]
    (warning,) = _warnings(topo, "duplicate_gpu")
    assert "GPU index 2" in warning.reason and "not offered" in warning.reason
    assert any(w["code"] == "duplicate_gpu" for w in topology_to_json(topo)["warnings"])  # what /v1/topology shows
    assert topo.nvlink.island_links[2] == before[2]  # its links are not counted as GPU 2's
    assert 5 not in topo.nvlink.island_links


def test_duplicate_gpu_address_in_nvml_json_is_a_warning_too(host_tree):
    root = host_tree("h800-8gpu")
    data = json.loads((root / "nvml.json").read_text())
    data["gpus"][6]["pci_bus_id"] = data["gpus"][1]["pci_bus_id"]
    (root / "nvml.json").write_text(json.dumps(data))
    topo = _discover(root)
    assert sorted(g.index for g in topo.gpus) == [0, 1, 2, 3, 4, 5, 7]
    assert len({g.address for g in topo.gpus}) == 7
    assert len(_warnings(topo, "duplicate_gpu")) == 1
