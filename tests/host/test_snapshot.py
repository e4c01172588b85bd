import tarfile

from topod.discover import discover
from topod.host import HostRoot
from topod.snapshot import write_snapshot
from topod.topojson import topology_to_json


def _without_root(doc):
    doc = dict(doc)
    doc.pop("root")
    return doc


def test_snapshot_extracts_to_a_root_with_the_same_topology(host_tree, tmp_path):
    for name in ("h800-8gpu", "nps4-8gpu"):
        root = host_tree(name)
        out = tmp_path / f"{name}.tar.gz"
        count = write_snapshot(HostRoot(root), str(out), name + "-snap")
        assert count > 100
        target = tmp_path / f"x-{name}"
        with tarfile.open(out) as archive:
            archive.extractall(target, filter="tar")
        original = topology_to_json(discover(HostRoot(root), live_nvml=False))
        copied = topology_to_json(discover(HostRoot(target / f"{name}-snap"), live_nvml=False))
        assert _without_root(copied) == _without_root(original)


def test_snapshot_keeps_links_as_links_and_carries_irq_files(host_tree, tmp_path):
    root = host_tree("h800-8gpu")
    out = tmp_path / "s.tar.gz"
    write_snapshot(HostRoot(root), str(out), "s")
    with tarfile.open(out) as archive:
        members = {m.name: m for m in archive.getmembers()}
    links = [m for n, m in members.items() if n.startswith("s/sys/bus/pci/devices/")]
    assert links and all(m.issym() for m in links)
    assert "s/proc/interrupts" in members and "s/nvml.json" in members
    assert any(n.endswith("/smp_affinity_list") for n in members)
    assert "s/topod-fixture.json" not in members
