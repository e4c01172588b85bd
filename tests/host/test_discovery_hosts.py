"""Discovery on the built-in hosts: what each kind of machine must look like."""

from topod.distance import DistanceModel


def test_h800_gpus_split_four_per_socket_with_one_rdma_nic_beside_each(topology_of):
    topo = topology_of("h800-8gpu")
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    model = DistanceModel(topo)
    nics = topo.devices_of_kind("rdma")
    assert len(nics) == 8
    for gpu in topo.gpus:
        beside = [n for n in nics if model.between(gpu.address, n.address).level == "PIX"]
        assert len(beside) == 1
    assert len(topo.devices_of_kind("nvme")) == 2


def test_h800_nvswitch_island_counts_real_links_not_zero(topology_of):
    topo = topology_of("h800-8gpu")
    assert topo.nvlink.islands == (tuple(range(8)),)
    assert set(topo.nvlink.island_links.values()) == {8}
    assert DistanceModel(topo).gpus(0, 7).label == "NVS8"


def test_h800_cpus_know_siblings_packages_and_l3(topology_of):
    topo = topology_of("h800-8gpu")
    cpu0 = topo.cpu(0)
    assert cpu0.siblings == (0, 32)
    assert cpu0.package == 0 and topo.cpu(16).package == 1
    assert cpu0.llc == 0 and topo.cpu(16).llc == 16
    assert topo.node(0).distances == {0: 10, 1: 21}


def test_h800_switch_groups_an_upstream_port_and_its_downstream_ports(topology_of):
    topo = topology_of("h800-8gpu")
    gpu0 = topo.device(topo.gpu(0).address)
    upstream = topo.device(gpu0.switch)
    assert upstream.kind == "bridge" and upstream.parent == gpu0.root_port
    downstream = topo.device(gpu0.parent)
    assert downstream.switch == gpu0.switch


def test_pcie_host_has_no_nvlink_and_pairs_share_switches(topology_of):
    topo = topology_of("pcie-8gpu")
    model = DistanceModel(topo)
    assert topo.nvlink.pairs == {} and topo.nvlink.islands == ()
    assert model.gpus(0, 1).level == "PIX"
    assert model.gpus(0, 2).level == "PHB"
    assert model.gpus(0, 4).level == "SYS"


def test_nps4_host_has_four_nodes_with_two_gpus_each_and_slit_scaled_sys(topology_of):
    topo = topology_of("nps4-8gpu")
    assert [n.id for n in topo.numa_nodes] == [0, 1, 2, 3]
    assert [g.numa_node for g in topo.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    model = DistanceModel(topo)
    near, far = model.gpus(0, 2), model.gpus(0, 4)
    assert near.level == far.level == "SYS"
    assert near.slit == 12 and far.slit == 32
    assert far.weight > near.weight


def test_dgx1_cube_mesh_link_counts_match_nvidia_smi(topology_of):
    topo = topology_of("dgx1-cubemesh")
    model = DistanceModel(topo)
    assert [model.gpus(0, j).label for j in range(8)] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert model.gpus(1, 5).label == "NV2"
    assert all(sum(topo.nvlink.links_between(i, j) for j in range(8) if j != i) == 6 for i in range(8))


def test_gpu_less_vm_has_one_node_no_gpus_and_no_warnings(topology_of):
    topo = topology_of("vm-nogpu")
    assert len(topo.numa_nodes) == 1 and topo.gpus == ()
    assert {d.numa_node_source for d in topo.pci_devices} == {"single_node"}
    assert topo.warnings == ()
