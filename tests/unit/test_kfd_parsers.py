"""The pure halves of AMD discovery: KFD's `key value` files, its PCI locations, model
names and partition modes, xGMI pairs and hives; and PCIe switch counting on raw PCI
functions (a device's own bridge pair is no switch)."""

from __future__ import annotations

import pytest

from topod.discover.kfd import (KfdLink, KfdNode, _hives, _xgmi_pairs, amd_gpus, model_name, parse_link,
                                parse_partition, parse_properties, pci_address, COMPUTE_PARTITIONS,
                                MEMORY_PARTITIONS)
from topod.discover.notes import Notes
from topod.discover.pci import RawFunction
from topod.discover.pcitree import build_pci_devices, device_bridge_ports, switch_upstream_ports
from topod.model import AmdGpu, Gpu, NumaNode


def test_properties_parse_decimal_pairs_and_report_the_rest():
    values, bad = parse_properties("cpu_cores_count 0\nlocation_id 5376\n\nunique_id 16380745584914379673\n"
                                   "name with spaces 3\nweight 0x14\n")
    assert values == {"cpu_cores_count": 0, "location_id": 5376, "unique_id": 16380745584914379673}
    assert bad == ["name with spaces 3", "weight 0x14"]


def test_location_id_is_bus_and_devfn():
    assert pci_address(0, (0x15 << 8) | 0) == "0000:15:00.0"
    assert pci_address(0x10, (0xC1 << 8) | (0x1F << 3) | 7) == "0010:c1:1f.7"


def test_link_needs_type_and_target():
    assert parse_link({"type": 11, "node_to": 3, "weight": 15, "max_bandwidth": 64000}) == KfdLink(11, 3, 15, 64000)
    assert parse_link({"weight": 15}) is None


@pytest.mark.parametrize(("device", "kfd_name", "product", "expected"), [
    (0x74A1, "ip discovery", None, "AMD Instinct MI300X"),
    (0x74A5, "ip discovery", None, "AMD Instinct MI325X"),
    (0x75A3, "", None, "AMD Instinct MI355X"),
    (0x7461, "ip discovery", "AMD Instinct MI999 OAM", "AMD Instinct MI999 OAM"),
    (0x738D, "arcturus", None, "arcturus"),
    (0x7461, "ip discovery", None, "AMD 1002:7461"),
])
def test_model_name_prefers_the_device_table_then_what_the_tree_says(device, kfd_name, product, expected):
    assert model_name(device, kfd_name, product) == expected


def test_partition_modes_are_read_only_when_amdgpu_names_them():
    assert parse_partition("CPX\n", COMPUTE_PARTITIONS) == "CPX"
    assert parse_partition("nps4\n", MEMORY_PARTITIONS) == "NPS4"
    assert parse_partition("XYZ\n", COMPUTE_PARTITIONS) is None
    assert parse_partition(None, COMPUTE_PARTITIONS) is None


def test_gfx_target_and_rocr_uuid_spelling():
    amd = AmdGpu(kfd_nodes=(2,), gpu_id=1, unique_id=0xAB, hive_id=None, render_minor=128, card=1,
                 gfx_target_version=90402)
    assert amd.gfx_target == "gfx942"
    assert amd.rocr_uuid == "GPU-00000000000000ab"
    assert AmdGpu((2,), 1, 0xAB, None, 128, 1, gfx_target_version=90010).gfx_target == "gfx90a"


def _gpu_node(number: int, bus: int, links: list[int], hive: int = 0) -> KfdNode:
    return KfdNode(number=number, gpu_id=number * 100, name="ip discovery",
                   properties={"location_id": bus << 8, "domain": 0, "hive_id": hive, "unique_id": number,
                               "drm_render_minor": 120 + 8 * number, "device_id": 0x74A1},
                   memory_bytes=2**30, io_links=tuple(KfdLink(11, n, 15) for n in links))


def test_xgmi_pairs_count_each_pair_once_and_ignore_partitions_of_one_gpu():
    nodes = [_gpu_node(1, 0x10, [2, 3]), _gpu_node(2, 0x20, [1]), _gpu_node(3, 0x30, [1])]
    index = {1: 0, 2: 1, 3: 2, 4: 0}  # node 4: a second partition of GPU 0
    nodes.append(KfdNode(4, 401, "", {"location_id": 0x1000}, 0, (KfdLink(11, 1, 15),)))
    assert _xgmi_pairs(nodes, index) == {(0, 1): 1, (0, 2): 1}


def test_hives_group_by_hive_id_else_by_xgmi_links():
    def gpu(index: int, hive: int | None) -> Gpu:
        return Gpu(index=index, address=f"0000:{index:02x}:00.0", uuid=None, name=None, memory_total_mib=None,
                   compute_capability=None, numa_node=None,
                   amd=AmdGpu((index,), index, index, hive, None, None))
    assert _hives([gpu(0, 7), gpu(1, 7), gpu(2, 9)], {}) == ((0, 1),)
    assert _hives([gpu(0, None), gpu(1, None), gpu(2, None)], {(0, 1): 1, (1, 2): 1}) == ((0, 1, 2),)


def test_a_gpu_without_numa_node_takes_its_cpu_nodes_through_the_pcie_io_link():
    numa = [NumaNode(id=0, cpus=(0, 1), distances={0: 10, 1: 32}, memory_bytes=None),
            NumaNode(id=1, cpus=(2, 3), distances={0: 32, 1: 10}, memory_bytes=None)]
    cpus = [KfdNode(0, 0, "", {"cpu_core_id_base": 0}, 0), KfdNode(1, 0, "", {"cpu_core_id_base": 2}, 0)]
    gpu = KfdNode(2, 55, "ip discovery", {"location_id": 0x1500, "domain": 0, "device_id": 0x74A1}, 2**34,
                  (KfdLink(2, 1, 20),))
    facts = amd_gpus(cpus + [gpu], [], numa, {}, {}, 0, notes := Notes())
    assert facts.gpus[0].numa_node == 1
    assert facts.gpus[0].memory_total_mib == 16384
    assert [w.code for w in notes.items] == ["kfd_gpu_not_in_sysfs"]


def _fn(address: str, ancestors: list[str], class_code: int, vendor: int = 0x1000) -> RawFunction:
    return RawFunction(address=address, sysfs_path=f"/sys/devices/pci0000:10/{address}", root_complex="pci0000:10",
                       ancestors=ancestors, vendor=vendor, device=0, class_code=class_code, driver=None,
                       numa_node_raw=0, local_cpus=None, link=None, msi_irqs=[])


BRIDGE = 0x060400
# root port -> switch up -> (down -> GPU's own bridge pair -> GPU) and (down -> NIC)
TREE = [
    _fn("0000:10:01.0", [], BRIDGE),
    _fn("0000:11:00.0", ["0000:10:01.0"], BRIDGE),
    _fn("0000:12:00.0", ["0000:10:01.0", "0000:11:00.0"], BRIDGE),
    _fn("0000:12:01.0", ["0000:10:01.0", "0000:11:00.0"], BRIDGE),
    _fn("0000:13:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0"], BRIDGE, 0x1002),
    _fn("0000:14:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"], BRIDGE, 0x1002),
    _fn("0000:15:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:00.0"],
        0x120000, 0x1002),
    _fn("0000:16:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:01.0"], 0x020700, 0x15B3),
]


def test_a_downstream_port_above_a_devices_bridge_pair_is_not_another_switch():
    ports = switch_upstream_ports(TREE)
    assert ports == {"0000:11:00.0", "0000:13:00.0"}  # the switch, and the GPU's own pair (a hop)
    assert device_bridge_ports(TREE, ports) == {"0000:13:00.0"}


def test_gpu_and_nic_under_one_switch_share_it_and_the_gpu_keeps_its_extra_hop():
    numa = [NumaNode(id=0, cpus=(0,), distances={0: 10}, memory_bytes=None)]
    devices = {d.address: d for d in build_pci_devices(TREE, numa, {0}, Notes())}
    gpu, nic = devices["0000:15:00.0"], devices["0000:16:00.0"]
    assert gpu.switch == nic.switch == "0000:11:00.0"
    assert gpu.bridge_chain == ("0000:10:01.0", "0000:11:00.0", "0000:13:00.0")
    assert nic.bridge_chain == ("0000:10:01.0", "0000:11:00.0")


def test_a_nested_switch_is_still_a_switch():
    nested = [
        _fn("0000:10:01.0", [], BRIDGE),
        _fn("0000:11:00.0", ["0000:10:01.0"], BRIDGE),
        _fn("0000:12:00.0", ["0000:10:01.0", "0000:11:00.0"], BRIDGE),
        _fn("0000:13:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0"], BRIDGE),
        _fn("0000:14:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"], BRIDGE),
        _fn("0000:14:01.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0"], BRIDGE),
        _fn("0000:15:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:00.0"],
            0x030200, 0x10DE),
        _fn("0000:16:00.0", ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:01.0"],
            0x030200, 0x10DE),
    ]
    ports = switch_upstream_ports(nested)
    assert ports == {"0000:11:00.0", "0000:13:00.0"}
    assert device_bridge_ports(nested, ports) == set()  # two devices below: a real switch


def test_prometheus_gpu_info_labels_vendor_and_model():
    from topod.export.metrics import render_metrics

    text = render_metrics({"gpu_info": [{"index": 0, "address": "0000:15:00.0", "vendor": "amd",
                                         "model": "AMD Instinct MI300X"},
                                        {"index": 1, "address": "0000:13:00.0", "vendor": "nvidia",
                                         "model": "NVIDIA H800"}]})
    assert ('topod_gpu_info{address="0000:15:00.0",gpu="0",model="AMD Instinct MI300X",vendor="amd"} 1.0'
            in text)
    assert 'vendor="nvidia"' in text
