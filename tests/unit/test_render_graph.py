"""The host graph model: every NUMA node, core group, root complex, switch and device is a
node; every PCI parent link, NVLink pair and NVSwitch membership is an edge; leases colour."""

import pytest

from topod.render.graph import build_graph, device_id, graph_parent

ENDPOINTS = {"gpu": "gpu", "rdma": "rdma", "nic": "nic", "nvme": "nvme", "nvswitch": "nvswitch"}


@pytest.fixture(scope="module")
def h800(tmp_path_factory):
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host, load_builtin_spec

    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path_factory.mktemp("render") / "h800-8gpu")
    return discover(HostRoot(root))


def test_every_numa_node_is_a_cluster_and_a_node_with_its_cores(h800):
    graph = build_graph(h800)
    assert [c.id for c in graph.clusters] == ["numa0", "numa1"]
    assert [n.id for n in graph.of_kind("numa")] == ["numa0", "numa1"]
    cores = graph.of_kind("cores")
    covered = sorted(c for group in cores for c in group.cpus)
    assert covered == sorted(h800.online_cpus)
    for group in cores:
        assert {h800.cpu(c).numa_node for c in group.cpus} == {int(group.cluster[4:])}
        assert any(e.tail == group.cluster and e.head == group.id for e in graph.edges_of("numa"))


def test_every_root_complex_switch_and_endpoint_is_a_node(h800):
    graph = build_graph(h800)
    complexes = {d.root_complex for d in h800.pci_devices if d.kind != "bridge"}
    assert {n.id for n in graph.of_kind("root_complex")} == {f"rc:{rc}" for rc in complexes}
    switches = {d.switch for d in h800.pci_devices if d.switch}
    assert {n.id for n in graph.of_kind("switch")} == {device_id(s) for s in switches}
    assert len(switches) == 8
    for kind, count in (("gpu", 8), ("rdma", 8), ("nic", 1), ("nvme", 2), ("nvswitch", 4)):
        nodes = graph.of_kind(kind)
        assert len(nodes) == count, kind
        assert {n.id for n in nodes} == {device_id(d.address) for d in h800.devices_of_kind(kind)
                                         if kind != "gpu" or d.address in {g.address for g in h800.gpus}}


def test_devices_sit_in_their_numa_cluster(h800):
    graph = build_graph(h800)
    for gpu in h800.gpus:
        assert graph.node(device_id(gpu.address)).cluster == f"numa{gpu.numa_node}"


def test_every_pci_parent_link_is_an_edge_with_bridges_folded(h800):
    graph = build_graph(h800)
    pci = {(e.tail, e.head) for e in graph.edges_of("pci")}
    switches = {d.switch for d in h800.pci_devices if d.switch}
    for device in h800.pci_devices:
        if device.kind == "bridge" and device.address not in switches:
            assert graph.node(device_id(device.address)) is None  # root/downstream ports fold away
            continue
        assert (graph_parent(h800, device, switches), device_id(device.address)) in pci
    gpu0 = h800.gpu(0)
    assert (device_id(h800.device(gpu0.address).switch), device_id(gpu0.address)) in pci
    switch = h800.device(h800.device(gpu0.address).switch)
    assert (f"rc:{switch.root_complex}", device_id(switch.address)) in pci


def test_every_gpu_is_a_member_of_the_nvswitch_fabric(h800):
    graph = build_graph(h800)
    assert [n.id for n in graph.of_kind("fabric")] == ["fabric:0"]
    members = {e.tail for e in graph.edges_of("nvswitch") if e.head == "fabric:0"}
    assert members == {device_id(g.address) for g in h800.gpus}
    chips = {e.head for e in graph.edges_of("nvswitch_chip")}
    assert chips == {device_id(d.address) for d in h800.devices_of_kind("nvswitch")}
    assert graph.edges_of("nvlink") == []  # no direct pairs on an NVSwitch host


def test_every_nvlink_pair_is_an_edge_on_a_cube_mesh(tmp_path):
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host, load_builtin_spec

    topology = discover(HostRoot(build_host(load_builtin_spec("dgx1-cubemesh"), tmp_path / "dgx1")))
    graph = build_graph(topology)
    edges = {(e.tail, e.head): e.label for e in graph.edges_of("nvlink")}
    assert len(edges) == len(topology.nvlink.pairs) == 16
    a, b = topology.gpu(0).address, topology.gpu(3).address
    assert edges[(device_id(a), device_id(b))] == "NV2"
    assert graph.of_kind("fabric") == []


def test_leases_colour_their_gpus_and_cores_by_owner(h800):
    leases = [{"id": "L1", "owner": "alice", "gpus": [0, 1], "cpus": [1, 2, 33, 34], "pids": []},
              {"id": "L2", "owner": "bob", "gpus": [4], "cpus": [], "pids": []}]
    graph = build_graph(h800, leases)
    owners = {n.id: n.owner for n in graph.of_kind("gpu")}
    assert owners[device_id(h800.gpu(0).address)] == "alice" and owners[device_id(h800.gpu(4).address)] == "bob"
    assert owners[device_id(h800.gpu(2).address)] is None
    assert "free" in graph.node(device_id(h800.gpu(2).address)).label
    assert graph.colour_of("alice") != graph.colour_of("bob")
    alice_cores = [n for n in graph.of_kind("cores") if n.owner == "alice"]
    assert [n.cpus for n in alice_cores] == [(1, 2, 33, 34)]


def test_irq_plan_links_devices_to_the_cores_that_take_their_interrupts(h800):
    nic = h800.device("0000:14:00.0")
    graph = build_graph(h800, irq_plan={str(irq): [5] for irq in nic.msi_irqs})
    edges = graph.edges_of("irq")
    assert [(e.tail, e.label) for e in edges] == [(device_id(nic.address), f"{len(nic.msi_irqs)} IRQ")]
    assert 5 in graph.node(edges[0].head).cpus
    assert "IRQs planned → CPU 5" in graph.node(device_id(nic.address)).label  # a plan is never called "now"


def test_a_lease_without_an_id_is_refused(h800):
    with pytest.raises(ValueError, match="needs an 'id'"):
        build_graph(h800, [{"owner": "x", "gpus": [0]}])


def test_storage_controllers_are_drawn(tmp_path):
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host, load_builtin_spec
    from topod.render.graph import build_graph

    root = build_host(load_builtin_spec("kvm-virtio"), tmp_path / "kvm")
    topology = discover(HostRoot(root), live_nvml=False)
    storage = [d.address for d in topology.pci_devices if d.kind == "storage"]
    assert storage
    from topod.render.graph import device_id

    graph = build_graph(topology)
    drawn = {node.id: node.kind for node in graph.nodes}
    assert all(drawn.get(device_id(address)) == "storage" for address in storage), \
        "virtio-blk and AHCI controllers appear in the picture"


def test_in_dry_run_the_picture_draws_where_irqs_are_and_labels_the_plan_planned(h800):
    nic = h800.device("0000:14:00.0")
    now = {str(irq): [0] for irq in nic.msi_irqs}  # a fresh host: every vector on CPU 0
    plan = {str(irq): [20] for irq in nic.msi_irqs}  # where the dry-run plan would put them (node 1)
    graph = build_graph(h800, irq_plan=plan, irq_current=now)
    edges = graph.edges_of("irq")
    assert len(edges) == 1 and 0 in graph.node(edges[0].head).cpus and 20 not in graph.node(edges[0].head).cpus
    label = graph.node(device_id(nic.address)).label
    assert "IRQs on → CPU 0" in label and "planned → CPU 20" in label
    same = build_graph(h800, irq_plan=now, irq_current=now).node(device_id(nic.address)).label
    assert "IRQs on → CPU 0" in same and "planned" not in same  # applied: nothing more to say
