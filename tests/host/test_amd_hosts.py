"""AMD Instinct hosts built from the KFD ABI (the mi300x-8gpu fixture, CPX and mixed
variants): discovery, switch counting, the matrix, allocation and the exports an ROCm
user reads."""

from __future__ import annotations

import re

import pytest

from topod.alloc.engine import allocate
from topod.alloc.request import FreeState, Request
from topod.cli.topo_text import render_topology
from topod.discover import discover
from topod.distance import DistanceModel
from topod.export.nccl import build_nccl_xml, render_nccl_xml
from topod.export.slurm import render_gres_conf
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.scope import control_nodes, device_allow

HOST = "mi300x-8gpu"


@pytest.fixture(scope="module")
def mi300x(tmp_path_factory):
    root = build_host(load_builtin_spec(HOST), tmp_path_factory.mktemp("mi300x"))
    return root, discover(HostRoot(root), live_nvml=False)


def test_fixture_is_the_kfd_abi_cpu_nodes_first_then_gpus(mi300x):
    root, _ = mi300x
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    assert sorted(int(p.name) for p in nodes.iterdir()) == list(range(10))
    assert (nodes / "0/gpu_id").read_text() == "0\n" and (nodes / "1/gpu_id").read_text() == "0\n"
    gpu = dict(line.split() for line in (nodes / "2/properties").read_text().splitlines())
    assert (gpu["vendor_id"], gpu["device_id"]) == (str(0x1002), str(0x74A1))
    assert int(gpu["location_id"]) == 0x15 << 8 and gpu["domain"] == "0"
    assert [int(dict(line.split() for line in (nodes / f"{n}/properties").read_text().splitlines())
                ["drm_render_minor"]) for n in range(2, 10)] == list(range(128, 192, 8))
    links = [dict(line.split() for line in (nodes / f"2/io_links/{m}/properties").read_text().splitlines())
             for m in range(8)]
    assert [(link["type"], link["weight"]) for link in links] == [("2", "20")] + [("11", "15")] * 7
    assert (root / "dev/kfd").exists() and (root / "dev/dri/renderD128").exists()
    assert not list((root / "dev").glob("nvidia*")) and not (root / "nvml.json").exists()


def test_eight_amd_gpus_named_with_memory_nodes_and_their_own_ids(mi300x):
    _, topology = mi300x
    gpus = topology.gpus
    assert len(gpus) == 8
    assert {(g.vendor, g.model, g.memory_total_mib) for g in gpus} == {("amd", "AMD Instinct MI300X", 192 * 1024)}
    assert [g.numa_node for g in gpus] == [0] * 4 + [1] * 4
    assert [g.amd.render_minor for g in gpus] == list(range(128, 192, 8))
    assert [g.amd.card for g in gpus] == list(range(1, 65, 8))
    assert all(re.fullmatch(r"GPU-[0-9a-f]{16}", g.uuid) and g.uuid == g.amd.rocr_uuid for g in gpus)
    assert len({g.amd.unique_id for g in gpus}) == 8 and len({g.amd.hive_id for g in gpus}) == 1
    assert {(g.amd.compute_partition, g.amd.memory_partition, g.amd.gfx_target) for g in gpus} == {
        ("SPX", "NPS1", "gfx942")}
    assert [g.device_files for g in gpus][:2] == [("/dev/dri/renderD128",), ("/dev/dri/renderD136",)]


def test_no_nvidia_warnings_for_amd_gpus(mi300x):
    _, topology = mi300x
    assert topology.warnings == ()


def test_xgmi_hive_is_all_to_all(mi300x):
    _, topology = mi300x
    assert topology.nvlink.hives == (tuple(range(8)),)
    assert len(topology.nvlink.xgmi) == 28 and set(topology.nvlink.xgmi.values()) == {1}
    model = DistanceModel(topology)
    assert {model.gpus(a, b).label for a in range(8) for b in range(8) if a != b} == {"XGMI"}
    assert model.gpus(0, 5).weight < model.between("0000:15:00.0", "0000:16:00.0").weight


def test_gpu_and_its_nic_print_under_one_switch_and_meet_at_pxb(mi300x):
    _, topology = mi300x
    gpu, nic = topology.device("0000:15:00.0"), topology.device("0000:16:00.0")
    assert gpu.switch == nic.switch == "0000:11:00.0"
    assert len({d.switch for d in topology.pci_devices if d.switch}) == 8  # one per GPU, not three
    assert DistanceModel(topology).between(gpu.address, nic.address).label == "PXB"
    text = render_topology(topology)
    block = text.split("PCIe switch 0000:11:00.0\n", 1)[1].split("\n  root complex", 1)[0]
    assert "GPU0 AMD Instinct MI300X" in block and "mlx5_0" in block


def test_matrix_reads_as_rocm_smi_and_nvidia_smi_users_expect(mi300x):
    _, topology = mi300x
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in render_topology(topology).splitlines()
            if line.startswith(("GPU", "NIC")) and "\t" in line}
    assert rows["GPU0"][:8] == [" X "] + ["XGMI"] * 7
    assert rows["GPU0"][8:16] == ["PXB", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert "XGMI = Connection traversing AMD xGMI links" in render_topology(topology)


@pytest.mark.parametrize("busy", [frozenset(), frozenset({0}), frozenset({5, 6})])
def test_four_gpu_lease_stays_on_one_socket_with_its_nics(mi300x, busy):
    _, topology = mi300x
    decision = allocate(topology, DistanceModel(topology), FreeState(busy_gpus=busy), Request(gpus=4, level="any"))
    assert len({topology.gpu(g).numa_node for g in decision.gpus}) == 1
    assert all(len(p.nics) == 1 and p.nics[0].level == "PXB" for p in decision.placements)
    assert decision.performance.weakest_pair == "XGMI"


def test_gres_conf_is_what_slurm_gpu_rsmi_writes_with_links(mi300x):
    _, topology = mi300x
    lines = [line for line in render_gres_conf(topology).splitlines() if line.startswith("Name=gpu")]
    assert lines[0] == "Name=gpu Type=amd_instinct_mi300x File=/dev/dri/renderD128 Cores=0-15 Links=-1,1,1,1,1,1,1,1"
    assert lines[7].split()[2:4] == ["File=/dev/dri/renderD184", "Cores=16-31"]
    assert "nvidia" not in render_gres_conf(topology)


def test_rccl_xml_marks_xgmi_peers_with_the_accelerator_class(mi300x):
    _, topology = mi300x
    text = render_nccl_xml(build_nccl_xml(topology, gpus=[0, 1, 2]))
    assert '<gpu dev="0" sm="94" gcn="gfx942" rank="0">' in text
    assert '<xgmi target="0000:35:00.0" count="1" tclass="0x120000"/>' in text
    assert text.count("<xgmi ") == 6  # each of 3 GPUs to the 2 others in the file
    assert "<nvlink" not in text


def test_scope_allows_kfd_and_only_the_leased_render_nodes(mi300x):
    root, topology = mi300x
    controls = control_nodes(HostRoot(root))
    assert controls == ["/dev/kfd"]
    allowed = device_allow([topology.gpu(2).device_files[0], topology.gpu(3).device_files[0]], controls)
    assert allowed == [("/dev/dri/renderD144", "rw"), ("/dev/dri/renderD152", "rw"), ("/dev/kfd", "rw")]
    assert device_allow([1, "/dev/dri/renderD128"], []) == [("/dev/nvidia1", "rw"), ("/dev/dri/renderD128", "rw")]


def test_cpx_partitions_are_one_gpu_each_with_eight_render_nodes(tmp_path):
    spec = load_builtin_spec(HOST)
    spec["kfd"] = dict(spec["kfd"], compute_partition="CPX", memory_partition="NPS4")
    topology = discover(HostRoot(build_host(spec, tmp_path)), live_nvml=False)
    assert len(topology.gpus) == 8
    first = topology.gpus[0]
    assert (first.amd.compute_partition, first.amd.memory_partition) == ("CPX", "NPS4")
    assert first.amd.render_minors == tuple(range(128, 136)) and len(first.amd.kfd_nodes) == 8
    assert first.memory_total_mib == 192 * 1024
    assert topology.nvlink.hives == (tuple(range(8)),) and len(topology.nvlink.xgmi) == 28


def test_numa_node_from_kfd_when_firmware_gives_none(tmp_path):
    spec = load_builtin_spec(HOST)
    for rc in spec["root_complex"]:
        rc["firmware_numa_node"] = -1
        rc["local_cpus"] = False
    topology = discover(HostRoot(build_host(spec, tmp_path)), live_nvml=False)
    assert [g.numa_node for g in topology.gpus] == [0] * 4 + [1] * 4


def test_mixed_host_keeps_nvml_for_nvidia_and_kfd_for_amd(tmp_path):
    spec = {"name": "mixed", "pcie_gen": 5, "cpu": {"sockets": 2, "cores_per_socket": 4, "threads_per_core": 1},
            "root_complex": [{"node": 0, "switches": [{"devices": ["gpu", "rdma"]}]},
                             {"node": 1, "switches": [{"devices": ["instinct", "rdma"]}]}]}
    topology = discover(HostRoot(build_host(spec, tmp_path)), live_nvml=False)
    nvidia, amd = topology.gpus
    assert (nvidia.vendor, nvidia.model, nvidia.source, nvidia.device_files) == (
        "nvidia", "NVIDIA H800", "nvml-file", ("/dev/nvidia0",))
    assert (amd.index, amd.vendor, amd.model, amd.source, amd.device_files) == (
        1, "amd", "AMD Instinct MI300X", "kfd", ("/dev/dri/renderD128",))
    assert topology.warnings == ()
    assert DistanceModel(topology).gpus(0, 1).label == "SYS"


def test_amd_gpu_without_kfd_is_named_from_pci_and_not_given_a_nvidia_minor(tmp_path):
    spec = {"name": "nokfd", "cpu": {"sockets": 1, "cores_per_socket": 4, "threads_per_core": 1},
            "root_complex": [{"node": 0, "devices": ["instinct"]}]}
    root = build_host(spec, tmp_path)
    import shutil
    shutil.rmtree(root / "sys/devices/virtual/kfd")
    topology = discover(HostRoot(root), live_nvml=False)
    (gpu,) = topology.gpus
    assert (gpu.vendor, gpu.model, gpu.amd) == ("amd", "AMD Instinct MI300X", None)
    assert not any("nvidia" in w.reason or w.code.startswith("gpu_minor") for w in topology.warnings)


def test_snapshot_carries_kfd_dri_and_amdgpu_attributes(tmp_path):
    import tarfile

    from topod.snapshot import write_snapshot
    from topod.topojson import topology_to_json

    root = build_host(load_builtin_spec(HOST), tmp_path / "tree")
    out = tmp_path / "mi.tar.gz"
    write_snapshot(HostRoot(root), str(out), "mi-snap")
    with tarfile.open(out) as archive:
        names = set(archive.getnames())
        archive.extractall(tmp_path / "x", filter="tar")
    assert {"mi-snap/dev/kfd", "mi-snap/dev/dri/renderD128", "mi-snap/sys/class/kfd/kfd",
            "mi-snap/sys/devices/virtual/kfd/kfd/topology/nodes/2/io_links/1/properties"} <= names
    original = topology_to_json(discover(HostRoot(root), live_nvml=False))
    copied = topology_to_json(discover(HostRoot(tmp_path / "x/mi-snap"), live_nvml=False))
    original.pop("root"), copied.pop("root")
    assert copied == original
    assert copied["gpus"][0]["amd"]["compute_partition"] == "SPX"
