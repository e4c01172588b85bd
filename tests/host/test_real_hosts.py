"""The real-machine corpus (hwloc's regression trees): topod must agree with lstopo 100 %."""

import json
import tarfile
from pathlib import Path

import pytest

from topod.discover import discover
from topod.host import HostRoot

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "data" / "hosts"
HOSTS = sorted(p.name[: -len(".truth.json")] for p in CORPUS.glob("*.truth.json")) if CORPUS.is_dir() else []

pytestmark = pytest.mark.skipif(not HOSTS, reason=f"real-host corpus not present at {CORPUS}")


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
    if "40intel64-2g2n4c+pcilocality" not in HOSTS:
        pytest.skip("host not in corpus")
    topo = discover(HostRoot(extracted("40intel64-2g2n4c+pcilocality")), live_nvml=False)
    unknown = [d for d in topo.pci_devices if d.numa_node is None]
    assert unknown, "numa_node=-1 with all-CPU local_cpus must stay unknown"
    assert all(d.numa_node_source == "unknown" for d in unknown)
    assert sum(w.code == "numa_unknown" for w in topo.warnings) == len(unknown)


def test_plx_switches_with_infiniband_behind_them_are_grouped(extracted):
    if "32intel64-2p8co2t+8ve" not in HOSTS:
        pytest.skip("host not in corpus")
    topo = discover(HostRoot(extracted("32intel64-2p8co2t+8ve")), live_nvml=False)
    switches = {d.switch for d in topo.pci_devices if d.switch}
    assert len(switches) == 2
    assert [d.kind for d in topo.pci_devices if d.vendor == 0x15B3] and all(
        d.kind == "rdma" for d in topo.pci_devices if d.vendor == 0x15B3 and d.class_code >> 8 == 0x0207)
    assert sum(len(d.msi_irqs) > 0 for d in topo.pci_devices) == 17
