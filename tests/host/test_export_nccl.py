"""NCCL topology XML: parsed back and checked against the host model."""

from __future__ import annotations

import os
import re
import stat
import xml.etree.ElementTree as ET

import pytest

from topod.discover import discover
from topod.errors import ConfigError
from topod.export.nccl import build_nccl_xml, cpumask, nccl_parents, render_nccl_xml
from topod.export.nccl_host import (
    DEFAULT_PATH,
    host_nccl_xml,
    identity_warnings,
    parse_cpuinfo,
    read_nccl_host_facts,
    write_nccl_topology,
)
from topod.host import HostRoot


@pytest.fixture(scope="module")
def host_of(readonly_host):
    return readonly_host



def export(host_of, name: str, **kwargs) -> tuple[ET.Element, str]:
    host, topology = host_of(name)
    text = host_nccl_xml(host, topology, **kwargs).text
    return ET.fromstring(text), text


def _parents(root: ET.Element) -> dict[ET.Element, ET.Element]:
    return {child: parent for parent in root.iter() for child in parent}


def _cpu_of(element: ET.Element, parents) -> ET.Element:
    while element.tag != "cpu":
        element = parents[element]
    return element


@pytest.mark.parametrize("name", ["h800-8gpu", "nps4-8gpu", "dgx1-cubemesh", "pcie-8gpu"])
def test_every_gpu_sits_under_the_cpu_of_its_numa_node(host_of, name):
    _, topology = host_of(name)
    root, _ = export(host_of, name)
    assert root.tag == "system" and root.get("version") == "1"
    parents = _parents(root)
    gpus = list(root.iter("gpu"))
    assert len(gpus) == len(topology.gpus)
    for gpu_el in gpus:
        pci = parents[gpu_el]
        gpu = next(g for g in topology.gpus if g.address == pci.get("busid"))
        assert gpu_el.get("dev") == str(gpu.index)
        assert gpu_el.get("sm") == "%d%d" % gpu.compute_capability
        assert pci.get("class") == "0x030200"
        assert _cpu_of(pci, parents).get("numaid") == str(gpu.numa_node)


def test_cpu_affinity_is_the_nodes_cpumask(host_of):
    root, _ = export(host_of, "h800-8gpu")
    affinity = {cpu.get("numaid"): cpu.get("affinity") for cpu in root.iter("cpu")}
    assert affinity == {"0": "0000ffff,0000ffff", "1": "ffff0000,ffff0000"}


def test_nvswitch_links_add_up_to_each_gpus_links(host_of):
    _, topology = host_of("h800-8gpu")
    root, _ = export(host_of, "h800-8gpu")
    switches = {d.address for d in topology.devices_of_kind("nvswitch")}
    for gpu_el in root.iter("gpu"):
        links = gpu_el.findall("nvlink")
        assert {link.get("target") for link in links} == switches
        assert {link.get("tclass") for link in links} == {"0x068000"}
        assert sum(int(link.get("count")) for link in links) == 8


def test_cube_mesh_nvlinks_name_the_peer_gpu_and_its_link_count(host_of):
    _, topology = host_of("dgx1-cubemesh")
    root, _ = export(host_of, "dgx1-cubemesh")
    index_of = {g.address: g.index for g in topology.gpus}
    parents = _parents(root)
    for gpu_el in root.iter("gpu"):
        me = index_of[parents[gpu_el].get("busid")]
        found = {index_of[l.get("target")]: int(l.get("count")) for l in gpu_el.findall("nvlink")}
        expected = {peer: topology.nvlink.links_between(me, peer) for peer in index_of.values()
                    if peer != me and topology.nvlink.links_between(me, peer)}
        assert found == expected
        assert {l.get("tclass") for l in gpu_el.findall("nvlink")} == {"0x030200"}


def test_pcie_only_gpus_have_no_nvlink_elements(host_of):
    root, _ = export(host_of, "pcie-8gpu")
    assert list(root.iter("nvlink")) == []


def test_every_nic_is_present_with_its_rdma_device_name(host_of):
    _, topology = host_of("h800-8gpu")
    root, _ = export(host_of, "h800-8gpu")
    parents = _parents(root)
    nets = {parents[parents[net]].get("busid"): net for net in root.iter("net")}
    nics = topology.devices_of_kind("rdma", "nic")
    assert set(nets) == {d.address for d in nics}
    for device in nics:
        net = nets[device.address]
        assert net.get("name") in device.names
        if device.kind == "rdma":
            assert net.get("name").startswith("mlx5_")  # the RDMA device, not the netdev
        assert _cpu_of(net, parents).get("numaid") == str(device.numa_node)
    assert sorted(int(net.get("dev")) for net in nets.values()) == list(range(len(nics)))


def test_pcie_switches_are_nested_pci_elements(host_of):
    _, topology = host_of("h800-8gpu")
    root, _ = export(host_of, "h800-8gpu")
    parents = _parents(root)
    for gpu in topology.gpus:
        pci = next(p for p in root.iter("pci") if p.get("busid") == gpu.address)
        switch = parents[pci]
        device = topology.device(gpu.address)
        assert switch.tag == "pci" and switch.get("busid") == device.switch
        assert switch.get("class") == "0x060400"
        assert parents[switch].tag == "cpu"  # root and downstream ports are skipped, as NCCL does


def test_gpus_without_a_switch_hang_directly_off_the_cpu(host_of):
    root, _ = export(host_of, "nps4-8gpu")
    parents = _parents(root)
    assert all(parents[parents[gpu]].tag == "cpu" for gpu in root.iter("gpu"))


def test_nested_switches_become_nested_pci_elements():
    from types import SimpleNamespace

    chain = {"e": "d2", "d2": "u2", "u2": "d1", "d1": "u1", "u1": "rp", "rp": None}
    devices = {a: SimpleNamespace(address=a, parent=p) for a, p in chain.items()}
    topology = SimpleNamespace(device=devices.get)
    assert nccl_parents(topology, devices["e"]) == ["u1", "u2"]
    assert nccl_parents(topology, devices["rp"]) == []


def test_firmware_numa_minus_one_is_placed_by_topods_correction(host_of):
    _, topology = host_of("vm-nogpu")
    nic = topology.devices_of_kind("nic")[0]
    assert nic.numa_node_raw == -1 and nic.numa_node == 0
    root, _ = export(host_of, "vm-nogpu")
    cpus = root.findall("cpu")
    assert [cpu.get("numaid") for cpu in cpus] == ["0"]
    assert cpus[0].find("pci").get("busid") == nic.address


def test_busids_and_targets_are_lowercase_as_nccl_expects(host_of):
    _, text = export(host_of, "h800-8gpu")
    values = re.findall(r'(?:busid|target)="([^"]*)"', text)
    assert values and all(v == v.lower() and re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", v)
                          for v in values)


def test_text_follows_nccls_own_dialect(host_of):
    _, text = export(host_of, "h800-8gpu")
    assert not text.startswith("<?xml")
    line = re.compile(r'^( {2})*(</[a-z]+>|<[a-z]+( [a-z_]+="[^"<>&]*")*/?>)$')
    assert all(line.match(l) for l in text.splitlines())
    assert " />" not in text


def test_link_attributes_come_from_the_slower_end(host_of):
    root, _ = export(host_of, "dgx1-cubemesh")
    for pci in root.iter("pci"):
        assert pci.get("link_speed") == "8.0 GT/s PCIe" and pci.get("link_width") == "16"


def test_a_lease_file_holds_only_its_gpus_and_local_nics(host_of):
    _, topology = host_of("h800-8gpu")
    root, _ = export(host_of, "h800-8gpu", gpus=[4, 5], cpus=[16, 17, 48])
    parents = _parents(root)
    assert sorted(int(g.get("dev")) for g in root.iter("gpu")) == [4, 5]
    assert sorted(int(g.get("rank")) for g in root.iter("gpu")) == [0, 1]
    assert [cpu.get("numaid") for cpu in root.findall("cpu")] == ["1"]
    assert root.find("cpu").get("affinity") == cpumask({16, 17, 48})
    nic_nodes = {_cpu_of(net, parents).get("numaid") for net in root.iter("net")}
    assert nic_nodes == {"1"} and len(list(root.iter("net"))) == 5  # 4 RDMA + 1 Ethernet on node 1


def test_a_lease_with_nics_lists_exactly_its_nics_under_their_switches(host_of):
    from topod.alloc.engine import allocate
    from topod.alloc.request import FreeState, Request
    from topod.distance import DistanceModel

    _, topology = host_of("h800-8gpu")
    decision = allocate(topology, DistanceModel(topology), FreeState(busy_gpus=frozenset({0, 1})), Request(gpus=2))
    nics = sorted({nic.address for p in decision.placements for nic in p.nics})
    names = sorted({nic.name for p in decision.placements for nic in p.nics})
    assert len(nics) == 2
    root, _ = export(host_of, "h800-8gpu", gpus=list(decision.gpus), nics=nics)
    nets = list(root.iter("net"))
    assert sorted(net.get("name") for net in nets) == names  # not the host's other six, nor its Ethernet NIC
    parents = _parents(root)
    for net in nets:
        switch = parents[parents[parents[net]]]  # <net> in <nic> in the NIC's <pci>, in the switch's <pci>
        assert switch.tag == "pci" and switch.find("pci/gpu") is not None  # beside the GPU's <pci>


def test_a_lease_file_drops_nvlinks_to_gpus_outside_the_lease(host_of):
    _, topology = host_of("dgx1-cubemesh")
    root, _ = export(host_of, "dgx1-cubemesh", gpus=[0, 3])
    targets = {l.get("target") for l in root.iter("nvlink")}
    assert targets == {topology.gpu(0).address, topology.gpu(3).address}


def test_a_lease_with_cpus_off_the_node_keeps_the_nodes_affinity(host_of):
    root, _ = export(host_of, "h800-8gpu", gpus=[0], cpus=[20])
    assert root.find("cpu").get("affinity") == "0000ffff,0000ffff"


def test_a_lease_naming_a_missing_gpu_is_an_error(host_of):
    _, topology = host_of("h800-8gpu")
    with pytest.raises(ConfigError, match=r"\[8\]"):
        build_nccl_xml(topology, gpus=[0, 8])


def test_facts_topod_was_not_given_are_not_guessed(host_of):
    _, topology = host_of("h800-8gpu")
    root = ET.fromstring(render_nccl_xml(build_nccl_xml(topology)))
    cpu = root.find("cpu")
    assert cpu.get("arch") is None and cpu.get("vendor") is None  # identity_warnings says so
    assert all(g.get("gdr") is None for g in root.iter("gpu"))
    assert all(p.get("subsystem_vendor") is None for p in root.iter("pci"))
    # RDMA device names are unknown without the host's facts: no guess; an Ethernet NIC's
    # only names are its netdevs, so it keeps one.
    assert [net.get("name") for net in root.iter("net")] == ["ens0f0"]


def test_host_facts_fill_cpu_model_subsystem_ids_and_gdr(host_tree):
    tree = host_tree("h800-8gpu")
    (tree / "proc/cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\n")
    (tree / "sys/bus/pci/devices/0000:13:00.0/subsystem_vendor").write_text("0x10de\n")
    (tree / "sys/bus/pci/devices/0000:13:00.0/subsystem_device").write_text("0x17a6\n")
    (tree / "sys/module/nvidia_peermem").mkdir(parents=True)
    (tree / "sys/module/nvidia_peermem/version").write_text("535.129.03\n")
    host = HostRoot(tree)
    topology = discover(host, live_nvml=False)
    facts = read_nccl_host_facts(host, topology)
    root = ET.fromstring(render_nccl_xml(build_nccl_xml(
        topology, cpu_identity=facts.cpu_identity, subsystem_ids=facts.subsystem_ids, gdr=facts.gdr)))
    cpu = root.find("cpu")
    assert (cpu.get("arch"), cpu.get("vendor"), cpu.get("familyid"), cpu.get("modelid")) == \
        ("x86_64", "GenuineIntel", "6", "143")
    gpu_pci = next(p for p in root.iter("pci") if p.get("busid") == "0000:13:00.0")
    assert (gpu_pci.get("subsystem_vendor"), gpu_pci.get("subsystem_device")) == ("0x10de", "0x17a6")
    assert {g.get("gdr") for g in root.iter("gpu")} == {"1"}


@pytest.mark.parametrize("text,expected", [
    ("processor : 0\nvendor_id : AuthenticAMD\ncpu family : 25\nmodel : 17\n", ("x86_64", "AuthenticAMD", 25, 17)),
    ("processor : 0\nBogoMIPS : 50.00\nCPU implementer : 0x41\n", ("arm64", None, None, None)),
    ("processor : 0\ncpu : POWER9, altivec supported\n", ("ppc64", None, None, None)),
    ("", (None, None, None, None)),
    (None, (None, None, None, None)),
])
def test_parse_cpuinfo_reads_the_first_processor(text, expected):
    ident = parse_cpuinfo(text)
    assert (ident.arch, ident.vendor, ident.familyid, ident.modelid) == expected


@pytest.mark.parametrize("cpus,mask", [
    ({0}, "00000001"),
    (set(range(16)) | set(range(32, 48)), "0000ffff,0000ffff"),
    ({64}, "00000001,00000000,00000000"),
])
def test_cpumask_matches_the_sysfs_cpumap_format(cpus, mask):
    assert cpumask(cpus) == mask


def test_writer_replaces_the_file_atomically_and_leaves_no_temp(tmp_path):
    target = tmp_path / "run" / "nvidia-topologyd" / "virtualTopology.xml"
    write_nccl_topology("<system version=\"1\"/>\n", target)
    write_nccl_topology("<system version=\"1\">\n</system>\n", target)
    assert target.read_text() == "<system version=\"1\">\n</system>\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert os.listdir(target.parent) == ["virtualTopology.xml"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "virtualTopology.xml"
    write_nccl_topology("old\n", target)
    with pytest.raises(UnicodeEncodeError):
        write_nccl_topology("caf\u00e9\n", target)
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["virtualTopology.xml"]


def test_default_path_is_where_nccl_looks_without_nccl_topo_file():
    assert DEFAULT_PATH == "/var/run/nvidia-topologyd/virtualTopology.xml"


@pytest.mark.parametrize("name,identity", [
    ("h800-8gpu", ("x86_64", "GenuineIntel", "6", "143")),
    ("nps4-8gpu", ("x86_64", "AuthenticAMD", "25", "17")),
    ("grace-hopper-2gpu", ("arm64", None, None, None)),  # NCCL reads vendor and family on x86 only
])
def test_every_cpu_element_carries_the_identity_nccl_builds_its_topology_from(host_of, name, identity):
    host, topology = host_of(name)
    written = host_nccl_xml(host, topology)
    cpus = list(ET.fromstring(written.text).iter("cpu"))
    assert len(cpus) >= 2
    assert {(c.get("arch"), c.get("vendor"), c.get("familyid"), c.get("modelid")) for c in cpus} == {identity}
    assert written.warnings == ()
    # every <pci> with the subsystem ids NCCL's ranks would otherwise fill unequally
    pci = list(ET.fromstring(written.text).iter("pci"))
    assert pci and all(p.get("subsystem_vendor") and p.get("subsystem_device") for p in pci)


def test_cpu_elements_without_arch_are_a_warning_unless_one_holds_every_gpu(host_of):
    # NCCL fills a <cpu>'s identity only above a rank's own GPU: a lone <cpu> holding the
    # GPUs is filled alike by every rank; a second one, or one with only NICs, is not.
    _, topology = host_of("h800-8gpu")
    both = build_nccl_xml(topology)
    assert [w.code for w in identity_warnings(both)] == ["nccl_cpu_identity_unknown"]
    assert "NUMA node(s) 0, 1 have no arch" in identity_warnings(both)[0].reason
    node0_gpus = [g.index for g in topology.gpus if g.numa_node == 0]
    assert identity_warnings(build_nccl_xml(topology, gpus=node0_gpus)) == []
    nic = next(d.address for d in topology.devices_of_kind("rdma") if d.numa_node == 0)
    nics_only = build_nccl_xml(topology, gpus=[], nics=[nic])
    assert [c.name for c in nics_only.children] == ["cpu"] and identity_warnings(nics_only) != []
    identified = build_nccl_xml(topology, cpu_identity=parse_cpuinfo("vendor_id : GenuineIntel\ncpu family : 6\n"))
    assert identity_warnings(identified) == []


def test_fixture_cpuinfo_names_the_spec_cpu_and_refuses_an_unknown_one(tmp_path):
    from topod.hostspec import build_host, load_builtin_spec

    spec = load_builtin_spec("vm-nogpu")
    spec["cpu"]["identity"] = "none"
    tree = build_host(spec, tmp_path / "none")
    assert parse_cpuinfo((tree / "proc/cpuinfo").read_text()).arch is None
    spec["cpu"]["identity"] = "sparc"
    with pytest.raises(ConfigError, match=r"\[cpu\] identity 'sparc' is not one of intel, amd, grace, none"):
        build_host(spec, tmp_path / "sparc")
