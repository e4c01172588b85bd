"""The rescan memo (topod.discover.memo): a pass with a memo must equal a full pass on
every tree, before and after every kind of change the host can make, and must never
keep a read that left a warning."""

import os
import shutil
import tarfile
from pathlib import Path

import pytest

from topod.discover import discover
from topod.discover.memo import DiscoveryMemo
from topod.host import HostRoot
from topod.hostspec import builtin_spec_names

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hosts"
REAL_HOSTS = sorted(p.name[: -len(".truth.json")] for p in CORPUS.glob("*.truth.json"))
GPU = "0000:13:00.0"  # h800-8gpu's GPU 0


def full(root: Path):
    return discover(HostRoot(root), live_nvml=False)


def rescanning(root: Path):
    """A memo warmed by one pass, and a function for the next passes."""
    host, memo = HostRoot(root), DiscoveryMemo()
    discover(host, live_nvml=False, memo=memo)
    return memo, lambda: discover(host, live_nvml=False, memo=memo)


def gpu_dir(root: Path, address: str = GPU) -> Path:
    return (root / "sys" / "bus" / "pci" / "devices" / address).resolve()


@pytest.mark.parametrize("name", builtin_spec_names())
def test_memo_pass_equals_full_pass_on_every_builtin_host(name, host_tree):
    root = host_tree(name)
    memo, again = rescanning(root)
    assert again() == full(root)
    assert memo.hits > 0 and memo.misses > 0  # the second pass used what the first one read


@pytest.mark.parametrize("name", REAL_HOSTS)
def test_memo_pass_equals_full_pass_on_every_real_host(name, tmp_path):
    with tarfile.open(CORPUS / f"{name}.tar.bz2") as archive:
        archive.extractall(tmp_path, filter="tar")
        root = tmp_path / archive.getnames()[0].split("/")[0]
    _memo, again = rescanning(root)
    assert again() == full(root)


def test_a_numa_node_written_in_place_is_seen(host_tree):
    # root may rewrite a device's numa_node (firmware bugs): never memoised
    root = host_tree("h800-8gpu")
    _memo, again = rescanning(root)
    (gpu_dir(root) / "numa_node").write_text("1\n")
    after = again()
    assert after.gpu(0).numa_node == 1
    assert after == full(root)


def test_a_link_that_trains_down_is_seen(host_tree):
    root = host_tree("h800-8gpu")
    _memo, again = rescanning(root)
    (gpu_dir(root) / "current_link_speed").write_text("2.5 GT/s PCIe\n")
    (gpu_dir(root) / "current_link_width").write_text("4\n")
    link = next(d for d in again().pci_devices if d.address == GPU).link
    assert (link.current_speed, link.current_width, link.max_width) == ("2.5 GT/s PCIe", 4, 16)


def test_a_removed_function_goes_and_is_forgotten(host_tree):
    root = host_tree("h800-8gpu")
    memo, again = rescanning(root)
    kept = len(memo.pci)
    (root / "sys" / "bus" / "pci" / "devices" / GPU).unlink()
    shutil.rmtree(gpu_dir_path := root / "sys" / "devices" / "pci0000:10" / "0000:10:01.0" / "0000:11:00.0"
                  / "0000:12:00.0" / GPU)
    assert not gpu_dir_path.exists()
    after = again()
    assert GPU not in {d.address for d in after.pci_devices}
    assert after == full(root)
    assert len(memo.pci) == kept - 1  # the memo never outgrows the host


def test_a_function_replaced_by_another_device_is_read_again(host_tree):
    # hot-swap in the same slot: same address, a new directory, a new identity
    root = host_tree("h800-8gpu")
    _memo, again = rescanning(root)
    directory = gpu_dir(root)
    saved = directory.with_name("saved")
    shutil.copytree(directory, saved, symlinks=True)
    shutil.rmtree(directory)
    shutil.copytree(saved, directory, symlinks=True)
    (directory / "device").write_text("0x2331\n")
    assert next(d for d in again().pci_devices if d.address == GPU).device == 0x2331


def test_cpus_going_offline_are_seen(host_tree):
    root = host_tree("h800-8gpu")
    memo, again = rescanning(root)
    (root / "sys" / "devices" / "system" / "cpu" / "online").write_text("0-31\n")
    after = again()
    assert [c.id for c in after.cpus if c.online] == list(range(32))
    assert after == full(root)
    assert memo.cpus is not None and frozenset(range(32)) in memo.cpus[0]


def test_a_bad_value_is_reported_on_every_pass_never_memoised(host_tree):
    root = host_tree("h800-8gpu")
    (gpu_dir(root) / "vendor").write_text("nvidia\n")
    _memo, again = rescanning(root)
    for _ in range(2):
        warnings = [w for w in again().warnings if w.code == "bad_value" and w.path.endswith("/vendor")]
        assert len(warnings) == 1, warnings
    # once fixed, the next pass reads the good value (the bad one was never kept)
    (gpu_dir(root) / "vendor").write_text("0x10de\n")
    assert next(d for d in again().pci_devices if d.address == GPU).vendor == 0x10DE


def test_an_unreadable_file_is_reported_on_every_pass(host_tree):
    root = host_tree("h800-8gpu")
    class_file = gpu_dir(root) / "class"
    class_file.unlink()
    os.mkfifo(class_file)  # a FIFO where a file was: never opened, reported
    _memo, again = rescanning(root)
    for _ in range(2):
        assert any(w.code == "not_a_regular_file" and w.path.endswith("/class") for w in again().warnings)


def test_another_root_starts_the_memo_afresh(host_tree):
    one, two = host_tree("h800-8gpu"), host_tree("pcie-8gpu")
    memo = DiscoveryMemo()
    discover(HostRoot(one), live_nvml=False, memo=memo)
    assert discover(HostRoot(two), live_nvml=False, memo=memo) == full(two)
    assert memo.root == str(HostRoot(two).root)
    assert len(memo.pci) == len(full(two).pci_devices)  # only the second host's functions


def test_local_cpus_follow_a_rewritten_numa_node(host_tree):
    # the kernel derives local_cpulist from the node: both change together, and the memo
    # (keyed by the node just read) reads the CPUs again
    root = host_tree("h800-8gpu")
    memo, again = rescanning(root)
    before = next(d for d in again().pci_devices if d.address == GPU)
    (gpu_dir(root) / "numa_node").write_text("1\n")
    (gpu_dir(root) / "local_cpulist").write_text("32-63\n")
    misses = memo.misses
    after = again()
    device = next(d for d in after.pci_devices if d.address == GPU)
    assert device.numa_node == 1 and device.local_cpus != before.local_cpus
    assert list(device.local_cpus) == list(range(32, 64))
    assert memo.misses == misses + 1  # that one function's CPUs, nothing else
    assert after == full(root)


def test_local_cpus_follow_cpus_going_offline(host_tree):
    root = host_tree("h800-8gpu")
    _memo, again = rescanning(root)
    (root / "sys" / "devices" / "system" / "cpu" / "online").write_text("0-15\n")
    # not the online set itself: a stale value cut to the online CPUs would not give this
    (gpu_dir(root) / "local_cpulist").write_text("0-7\n")
    after = again()
    assert list(next(d for d in after.pci_devices if d.address == GPU).local_cpus) == list(range(8))
    assert after == full(root)


def test_a_bad_local_cpulist_is_reported_on_every_pass(host_tree):
    root = host_tree("h800-8gpu")
    (gpu_dir(root) / "local_cpulist").write_text("zero to three\n")
    _memo, again = rescanning(root)
    for _ in range(2):
        assert any(w.code == "bad_value" and w.path.endswith("/local_cpulist") for w in again().warnings)


def test_an_unchanged_nvml_report_is_parsed_once(host_tree):
    from topod.discover.nvml import parse_nvml_json

    root = host_tree("h800-8gpu")
    _memo, again = rescanning(root)
    parse_nvml_json.cache_clear()
    again()
    again()
    info = parse_nvml_json.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    # a bad file is refused on every pass, never remembered
    (root / "nvml.json").write_text('{"gpus": 7}')
    for _ in range(2):
        assert any(w.code == "bad_value" and w.path == "nvml.json" and "gpus" in w.reason for w in again().warnings)
