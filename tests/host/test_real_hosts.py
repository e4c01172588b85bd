"""The real-machine corpus (hwloc's regression trees): topod must agree with lstopo 100 %."""

import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from topod.discover import discover
from topod.host import HostRoot

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "hosts"  # vendored: a fresh clone has it, nothing here skips
HOSTS = sorted(p.name[: -len(".truth.json")] for p in CORPUS.glob("*.truth.json"))
NUMBER_WORDS = {"nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14}


def test_vendored_corpus_is_complete_and_as_many_hosts_as_the_docs_claim():
    assert (CORPUS / "HWLOC-COPYING").is_file(), "hwloc's BSD-3-Clause notice must travel with its data"
    assert "Redistribution and use" in (CORPUS / "HWLOC-COPYING").read_text()
    assert len(HOSTS) == 11, HOSTS
    for name in HOSTS:  # every host has its tree and the lstopo view its truth came from
        assert (CORPUS / f"{name}.tar.bz2").is_file() and (CORPUS / f"{name}.lstopo.xml").is_file(), name
    claim = re.search(r"for all (\w+) hosts of", (REPO / "docs" / "architecture.md").read_text())
    assert claim, "docs/architecture.md's real-machine check names its host count"
    assert NUMBER_WORDS.get(claim.group(1)) == len(HOSTS), claim.group(0)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            target = tmp_path_factory.mktemp(name)
            with tarfile.open(CORPUS / f"{name}.tar.bz2") as archive:
                archive.extractall(target, filter="tar")
                top = archive.getnames()[0].split("/")[0]
            cache[name] = target / top
        return cache[name]

    return get


@pytest.mark.parametrize("name", HOSTS)
def test_numa_nodes_parents_and_local_cpus_match_lstopo(name, extracted):
    truth = json.loads((CORPUS / f"{name}.truth.json").read_text())
    topo = discover(HostRoot(extracted(name)), live_nvml=False)
    nodes = {str(node.id): list(node.local_cpus) for node in topo.numa_nodes}
    for node_id, cpus in truth["numa_nodes"].items():
        assert nodes.get(node_id) == cpus, f"{name}: node {node_id}"
    devices = {device.address: device for device in topo.pci_devices}
    for address, facts in truth["pci"].items():
        assert address in devices, f"{name}: {address} missing"
        assert devices[address].parent == facts["parent"], f"{name}: parent of {address}"
        assert list(devices[address].local_cpus) == facts["cpus"], f"{name}: local CPUs of {address}"


def test_broken_firmware_locality_is_reported_not_hidden(extracted):
    topo = discover(HostRoot(extracted("40intel64-2g2n4c+pcilocality")), live_nvml=False)
    unknown = [d for d in topo.pci_devices if d.numa_node is None]
    assert unknown, "numa_node=-1 with all-CPU local_cpus must stay unknown"
    assert all(d.numa_node_source == "unknown" for d in unknown)
    assert sum(w.code == "numa_unknown" for w in topo.warnings) == len(unknown)


def test_plx_switches_with_infiniband_behind_them_are_grouped(extracted):
    topo = discover(HostRoot(extracted("32intel64-2p8co2t+8ve")), live_nvml=False)
    switches = {d.switch for d in topo.pci_devices if d.switch}
    assert len(switches) == 2
    assert [d.kind for d in topo.pci_devices if d.vendor == 0x15B3] and all(
        d.kind == "rdma" for d in topo.pci_devices if d.vendor == 0x15B3 and d.class_code >> 8 == 0x0207)
    assert sum(len(d.msi_irqs) > 0 for d in topo.pci_devices) == 17


def _lstopo_cores(name: str) -> set[frozenset[int]]:
    """The CPUs of each Core in the host's stored lstopo XML, read as scripts/lstopo_compare.py reads it."""
    from scripts.lstopo_compare import parse_lstopo_xml

    return parse_lstopo_xml((CORPUS / f"{name}.lstopo.xml").read_text())[1]


@pytest.mark.parametrize("name", HOSTS)
def test_each_cpus_hyper_thread_siblings_are_its_lstopo_core(name, extracted):
    # 16em64t's kernel has only the topology/thread_siblings masks: read as lists, every
    # hyper-thread was a core of its own there.
    topo = discover(HostRoot(extracted(name)), live_nvml=False)
    ours = {frozenset(cpu.siblings) for cpu in topo.cpus if cpu.online}
    theirs = _lstopo_cores(name)
    if name == "64amd64-4s2n4ca2co":
        # The kernel lists each Bulldozer compute unit's two cores as thread siblings (the
        # scheduler's SMT view, which topod keeps); hwloc splits them by core_id.
        assert all(len(pair) == 2 and {frozenset({cpu}) for cpu in pair} <= theirs for pair in ours)
        assert len(ours) * 2 == len(theirs)
    else:
        assert ours == theirs


@pytest.mark.skipif(shutil.which("lstopo-no-graphics") is None, reason="hwloc's lstopo is not installed")
def test_the_lstopo_comparison_script_agrees_on_the_vendored_corpus_but_for_64amd64s_cores():
    # scripts/lstopo_compare.py, which docs/architecture.md's hwloc-suite figures come from, run live
    out = subprocess.run([sys.executable, str(REPO / "scripts/lstopo_compare.py"), str(CORPUS)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    differing = [line.split(":")[0] for line in out.splitlines() if line.endswith(": differs")]
    assert differing == ["64amd64-4s2n4ca2co"], out
    totals = dict(part.rsplit(" ", 1) for part in out.splitlines()[-1].removeprefix("totals: ").split(", "))
    assert totals["numa nodes agreeing"] == totals["numa nodes"]
    assert totals["PCI functions agreeing"] == totals["PCI functions"] and int(totals["PCI functions"]) > 60
    assert int(totals["trees whose cores agree"]) == int(totals["trees"]) - 1 == len(HOSTS) - 1


@pytest.mark.parametrize("name", HOSTS)
def test_a_snapshot_of_each_real_tree_discovers_as_the_tree_does(name, extracted, tmp_path):
    """`topoctl snapshot` carries every file discovery reads, the kernel's older mask files
    too (16em64t has thread_siblings and shared_cpu_map, no lists)."""
    from topod.snapshot import write_snapshot
    from topod.topojson import topology_to_json

    write_snapshot(HostRoot(extracted(name)), str(tmp_path / "snap.tar.gz"), "snap")
    with tarfile.open(tmp_path / "snap.tar.gz") as archive:
        archive.extractall(tmp_path / "x", filter="tar")
    original = topology_to_json(discover(HostRoot(extracted(name)), live_nvml=False))
    copied = topology_to_json(discover(HostRoot(tmp_path / "x" / "snap"), live_nvml=False))
    assert {**copied, "root": None} == {**original, "root": None}
