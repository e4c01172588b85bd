"""Today's and tomorrow's GPU servers: HMAT initiators and memory tiers (CXL), GPU memory
as NUMA nodes and NVLink-C2C (Grace Hopper/Blackwell), multi-node NVLink cliques (NVL72),
PCI functions outside host bridges, virtio and block device names."""

import json
import shutil
import tarfile

from topod.discover import discover
from topod.distance import DistanceModel
from topod.export.metrics import render_metrics
from topod.export.nrt import build_nrt
from topod.export.slurm_topology import host_entry, render_topology_conf
from topod.host import HostRoot
from topod.snapshot import write_snapshot
from topod.topojson import topology_to_json

NODE = "sys/devices/system/node"


def _topo(root):
    return discover(HostRoot(root), live_nvml=False)


def _codes(topology):
    return [w.code for w in topology.warnings]


# ---- HMAT, memory tiers (cxl-expander) ------------------------------------------------

def test_hmat_initiators_place_cxl_nodes_even_against_the_slit(host_tree):
    topo = _topo(host_tree("cxl-expander"))
    node2, node5 = topo.node(2), topo.node(5)
    assert [n.id for n in topo.numa_nodes] == [0, 1, 2, 5]  # sparse ids kept
    assert (node2.initiator_source, node2.initiators) == ("hmat-access1", (0,))
    assert node2.local_cpus == topo.node(0).cpus
    # node 5: only access0, and a SLIT whose nearest CPU node is 0 (24 < 26): HMAT wins
    assert node5.distances[0] < node5.distances[1]
    assert (node5.initiator_source, node5.initiators) == ("hmat-access0", (1,))
    assert node5.local_cpus == topo.node(1).cpus
    assert node2.access.read_bandwidth == 65536 and node2.access.write_latency == 260
    assert node5.access.read_latency == 300 and node5.access.write_bandwidth is None
    doc = topology_to_json(topo)["numa_nodes"][2]
    assert doc["initiator_source"] == "hmat-access1" and doc["initiators"] == [0]
    assert doc["access"]["read_bandwidth_mb_s"] == 65536


def test_without_hmat_a_cpu_less_node_falls_back_to_the_slit_nearest(host_tree):
    root = host_tree("cxl-expander")
    shutil.rmtree(root / NODE / "node5" / "access0")
    topo = _topo(root)
    assert (topo.node(5).initiator_source, topo.node(5).initiators) == ("slit", (0,))
    assert topo.node(5).local_cpus == topo.node(0).cpus and topo.node(5).access is None


def test_hmat_initiators_without_cpus_fall_through_to_the_next_source(host_tree):
    root = host_tree("cxl-expander")
    initiators = root / NODE / "node2" / "access1" / "initiators"
    (initiators / "node0").unlink()
    (initiators / "node2").symlink_to("../../../node2")  # itself: a node with no CPUs
    topo = _topo(root)
    assert topo.node(2).initiator_source == "hmat-access0"  # access0 still names node 0
    assert "hmat_initiators_without_cpus" in _codes(topo)


def test_memory_tiers_are_reported_per_node(host_tree):
    topo = _topo(host_tree("cxl-expander"))
    assert {n.id: n.memory_tier for n in topo.numa_nodes} == {0: 4, 1: 4, 2: 22, 5: 22}
    assert all(n.memory_tier is None for n in _topo(host_tree("h800-8gpu")).numa_nodes)


# ---- Grace Hopper: GPU memory nodes and C2C -------------------------------------------

def test_gpu_memory_nodes_link_both_ways_from_nvml_json(host_tree):
    topo = _topo(host_tree("grace-hopper-2gpu"))
    assert [(g.index, g.numa_node, g.memory_numa_node, g.memory_numa_source) for g in topo.gpus] == [
        (0, 0, 2, "nvml-file"), (1, 1, 10, "nvml-file")]
    assert {n.id: n.gpu for n in topo.numa_nodes} == {0: None, 1: None, 2: 0, 3: None, 10: 1, 11: None}
    assert [len(topo.node(n).cpus) for n in (0, 1)] == [72, 72]
    assert all(len(c.siblings) == 1 for c in topo.cpus)  # no SMT
    doc = topology_to_json(topo)
    assert doc["gpus"][1]["memory_numa_node"] == 10 and doc["numa_nodes"][4]["gpu"] == 1


def test_gpu_memory_node_heuristic_without_nvml_field(host_tree):
    root = host_tree("grace-hopper-2gpu")
    nvml = json.loads((root / "nvml.json").read_text())
    for gpu in nvml["gpus"]:
        del gpu["memory_numa_node"]
    (root / "nvml.json").write_text(json.dumps(nvml))
    topo = _topo(root)
    # nodes 3 and 11 are near too, but empty: only the 95 GiB nodes match the 97871 MiB GPUs
    assert [(g.memory_numa_node, g.memory_numa_source) for g in topo.gpus] == [
        (2, "sysfs-heuristic"), (10, "sysfs-heuristic")]
    guessed = [w for w in topo.warnings if w.code == "gpu_memory_node_guessed"]
    assert len(guessed) == 2 and "near node 0" in guessed[0].reason


def test_heuristic_refuses_a_node_whose_size_does_not_match(host_tree):
    root = host_tree("grace-hopper-2gpu")
    nvml = json.loads((root / "nvml.json").read_text())
    for gpu in nvml["gpus"]:
        del gpu["memory_numa_node"]
        gpu["memory_total_mib"] = 40960  # a 40 GiB GPU cannot be a 95 GiB node
    (root / "nvml.json").write_text(json.dumps(nvml))
    topo = _topo(root)
    assert [g.memory_numa_node for g in topo.gpus] == [None, None]
    assert "gpu_memory_node_guessed" not in _codes(topo)


def test_nvml_memory_node_that_sysfs_lacks_is_ignored_with_a_warning(host_tree):
    root = host_tree("grace-hopper-2gpu")
    nvml = json.loads((root / "nvml.json").read_text())
    nvml["gpus"][0]["memory_numa_node"] = 7
    (root / "nvml.json").write_text(json.dumps(nvml))
    topo = _topo(root)
    assert topo.gpus[0].memory_numa_node == 2  # the heuristic, not NVML's bad id
    assert any(w.code == "bad_value" and "node 7" in w.reason for w in topo.warnings)


def test_c2c_is_its_own_level_cheaper_than_pcie_for_the_gpus_cpu_node(host_tree):
    topo = _topo(host_tree("grace-hopper-2gpu"))
    model = DistanceModel(topo)
    own, other = model.gpu_to_node(0, 0), model.gpu_to_node(0, 1)
    assert own.level == "C2C" and other.level == "SYS"
    assert own.weight < model.gpu_to_node(0, 2).weight + 1e-9 and own.weight < 10.0  # below PIX
    assert topo.gpus[0].c2c.bandwidth_gbps == 450.0
    # a PCIe GPU on its own node is PHB, not C2C
    pcie = _topo(host_tree("cxl-expander"))
    assert DistanceModel(pcie).gpu_to_node(0, 0).level == "PHB"
    doc = topology_to_json(topo)["gpu_numa_distances"]
    assert doc["nodes"] == [0, 1, 2, 3, 10, 11] and doc["levels"][1][1] == "C2C" and doc["levels"][1][0] == "SYS"


def test_c2c_without_a_figure_uses_the_documented_table(host_tree):
    root = host_tree("grace-hopper-2gpu")
    nvml = json.loads((root / "nvml.json").read_text())
    nvml["gpus"][0]["c2c"] = {}
    nvml["gpus"][1]["c2c"] = None
    (root / "nvml.json").write_text(json.dumps(nvml))
    topo = _topo(root)
    assert (topo.gpus[0].c2c.bandwidth_gbps, topo.gpus[0].c2c.source) == (450.0, "table")
    assert topo.gpus[1].c2c is None and DistanceModel(topo).gpu_to_node(1, 1).level == "PHB"


# ---- NVL72: fabric clique -> exports ----------------------------------------------------

def test_nvl72_trays_share_one_clique_and_publish_it(host_tree):
    trays = [_topo(host_tree(f"gb200-nvl72-tray{i}")) for i in (0, 1)]
    docs = [topology_to_json(t) for t in trays]
    assert [d["hostname"] for d in docs] == ["nvl72-r01-t0", "nvl72-r01-t1"]
    domains = [d["nvlink_domain"] for d in docs]
    assert domains[0]["cluster_uuid"] == domains[1]["cluster_uuid"] == "5a1b0c2d-0000-4e3f-9a7b-72a000000001"
    assert domains[0]["clique_ids"] == [32766] and domains[0]["gpus_per_clique"] == {"32766": [0, 1, 2, 3]}
    assert all(g["fabric"]["state"] == "completed" for g in docs[0]["gpus"])
    assert trays[0].nvlink.islands == ((0, 1, 2, 3),)  # NVSwitch trays outside the host still group them
    attrs = {a["name"]: a["value"] for a in build_nrt(trays[0], "t0")["attributes"]}
    assert attrs["topod.io/nvlink-cluster"] == domains[0]["cluster_uuid"]
    assert attrs["topod.io/nvlink-clique"] == "32766"
    text = render_metrics({"nvlink_domain": domains[0]})
    assert 'topod_nvlink_domain_info{clique_id="32766",cluster_uuid="5a1b0c2d-0000-4e3f-9a7b-72a000000001"} 1.0' in text
    conf = render_topology_conf([host_entry(d) for d in docs])
    assert "BlockName=nvl-5a1b0c2d-32766 Nodes=nvl72-r01-t0,nvl72-r01-t1" in conf.splitlines()
    assert "BlockSizes=2" in conf.splitlines()


def test_hosts_without_a_domain_have_none_and_no_attributes(host_tree):
    topo = _topo(host_tree("h800-8gpu"))
    assert topology_to_json(topo)["nvlink_domain"] is None
    names = {a["name"] for a in build_nrt(topo, "x")["attributes"]}
    assert not {"topod.io/nvlink-cluster", "topod.io/nvlink-clique"} & names


# ---- PCI functions outside host bridges; virtio and block names ------------------------

def test_function_outside_host_bridges_is_reported_not_dropped(host_tree):
    topo = _topo(host_tree("kvm-virtio"))
    odd = topo.device("0001:00:00.0")
    assert odd is not None and odd.parent is None and odd.root_complex == ""
    assert odd.numa_node == 0 and odd.numa_node_source in ("firmware", "single_node")
    assert odd.local_cpus == (0, 1, 2, 3)
    assert [w.path for w in topo.warnings if w.code == "unexpected_path"] == ["/sys/bus/pci/devices/0001:00:00.0"]
    assert topology_to_json(topo)["pci_devices"][-1]["root_complex"] is None
    # two functions outside any host bridge are not "the same root complex"
    assert DistanceModel(topo).between("0001:00:00.0", "0000:00:01.0").level != "PHB"


def test_virtio_and_block_devices_get_names_and_kinds(host_tree):
    topo = _topo(host_tree("kvm-virtio"))
    by_address = {d.address: (d.kind, d.names) for d in topo.pci_devices}
    assert by_address["0000:00:01.0"] == ("nic", ("eth0",))
    assert by_address["0000:00:02.0"] == ("storage", ("vda",))
    assert by_address["0000:00:03.0"][0] == "storage"  # AHCI, class 0x0106
    nvme = [d for d in _topo(host_tree("h800-8gpu")).pci_devices if d.class_code == 0x010802]
    assert nvme and all(d.kind == "nvme" for d in nvme)  # NVMe keeps its kind


def test_snapshot_round_trip_keeps_the_new_facts(host_tree, tmp_path):
    for name in ("grace-hopper-2gpu", "cxl-expander", "kvm-virtio", "gb200-nvl72-tray0"):
        root = host_tree(name)
        out = tmp_path / f"{name}.tar.gz"
        write_snapshot(HostRoot(root), str(out), "snap")
        target = tmp_path / f"x-{name}"
        with tarfile.open(out) as archive:
            archive.extractall(target, filter="tar")
        original = topology_to_json(_topo(root))
        copied = topology_to_json(_topo(target / "snap"))
        original.pop("root")
        copied.pop("root")
        assert copied == original, name


def test_topoctl_export_slurm_topology_reads_files_and_stdin(host_tree, tmp_path, monkeypatch, capsys):
    import io

    from topod.cli.topoctl import main

    files = []
    for i in (0, 1):
        doc = topology_to_json(_topo(host_tree(f"gb200-nvl72-tray{i}")))
        path = tmp_path / f"t{i}.json"
        path.write_text(json.dumps(doc))
        files.append(path)
    monkeypatch.setattr("sys.stdin", io.StringIO(files[1].read_text()))
    assert main(["export", "slurm-topology", str(files[0]), "-", "--name", "gpu-a", "--name", "gpu-b"]) == 0
    out = capsys.readouterr().out
    assert "BlockName=nvl-5a1b0c2d-32766 Nodes=gpu-a,gpu-b" in out.splitlines()
