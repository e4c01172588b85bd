import json
import re

import pytest

from topod.discover.numa import parse_distance_row, parse_meminfo_total
from topod.discover.nvml import build_fabric, normalize_bus_id, parse_nvml_json
from topod.discover.pcitree import classify


def test_node_meminfo_total_in_bytes():
    assert parse_meminfo_total("Node 1 MemTotal:  1024 kB\nNode 1 MemFree: 3 kB\n") == 1024 * 1024


def test_meminfo_without_total_is_unknown_not_zero():
    assert parse_meminfo_total("Node 0 MemFree: 3 kB") is None


def test_distance_row_rejects_non_positive_values():
    assert parse_distance_row("10 21\n") == [10, 21]
    with pytest.raises(ValueError):
        parse_distance_row("10 0")
    with pytest.raises(ValueError):
        parse_distance_row("10 x")


@pytest.mark.parametrize(
    ("vendor", "class_code", "ib", "kind"),
    [
        (0x10DE, 0x030200, False, "gpu"),
        (0x10DE, 0x030000, False, "gpu"),
        (0x10DE, 0x068000, False, "nvswitch"),
        (0x1002, 0x038000, False, "gpu"),
        (0x1DA3, 0x120000, False, "gpu"),  # a processing accelerator
        (0x1A03, 0x030000, False, "other"),  # the BMC's VGA is not a GPU
        (0x15B3, 0x020700, False, "rdma"),
        (0x15B3, 0x020000, True, "rdma"),  # RoCE: Ethernet class with an infiniband child
        (0x8086, 0x020000, False, "nic"),
        (0x144D, 0x010802, False, "nvme"),
        (0x8086, 0x060400, False, "bridge"),
        (0x8086, 0x0C0330, False, "other"),
        (None, None, False, "other"),
    ],
)
def test_device_kind_from_vendor_class_and_children(vendor, class_code, ib, kind):
    assert classify(vendor, class_code, ib) == kind


def test_nvml_bus_id_is_normalised_to_sysfs_form():
    assert normalize_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert normalize_bus_id("1a:00.0") == "0000:1a:00.0"


def _gpu(index, bus, links=()):
    return {"index": index, "pci_bus_id": bus, "uuid": f"GPU-{index}", "name": "X", "memory_total_mib": 1,
            "compute_capability": [9, 0], "nvlinks": list(links)}


def _link(n, remote, kind):
    return {"link": n, "active": True, "remote_pci_bus_id": remote, "remote_device_type": kind}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{", "not JSON"),
        ("[]", "'gpus' list"),
        (json.dumps({"gpus": [{"index": -1, "pci_bus_id": "0000:01:00.0"}]}), "gpus[0].index"),
        (json.dumps({"gpus": [{"index": 0}]}), "gpus[0].pci_bus_id"),
        (json.dumps({"gpus": [{"index": 0, "pci_bus_id": "zz"}]}), "not a PCI address"),
        (json.dumps({"gpus": [_gpu(0, "0000:01:00.0", [_link(0, "0000:02:00.0", "toaster")])]}),
         "remote_device_type"),
        (json.dumps({"gpus": [{**_gpu(0, "0000:01:00.0"), "compute_capability": [9]}]}), "compute_capability"),
    ],
)
def test_bad_nvml_json_names_the_bad_field(document, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_nvml_json(document)


def test_nvlink_pairs_count_links_both_ends_agree_on():
    doc = {"gpus": [
        _gpu(0, "0000:01:00.0", [_link(0, "0000:02:00.0", "gpu"), _link(1, "0000:02:00.0", "gpu")]),
        _gpu(1, "0000:02:00.0", [_link(0, "0000:01:00.0", "gpu"), _link(1, "0000:01:00.0", "gpu")]),
    ]}
    report = parse_nvml_json(json.dumps(doc))
    fabric = build_fabric(report, {"0000:01:00.0": 0, "0000:02:00.0": 1})
    assert fabric.links_between(0, 1) == 2
    assert fabric.islands == ()


def test_gpus_on_shared_nvswitches_form_one_island_with_real_link_counts():
    switches = ["0000:a0:00.0", "0000:a1:00.0"]
    doc = {"gpus": [
        _gpu(i, f"0000:0{i + 1}:00.0", [_link(n, switches[n % 2], "switch") for n in range(18)]) for i in range(3)
    ]}
    fabric = build_fabric(parse_nvml_json(json.dumps(doc)), {f"0000:0{i + 1}:00.0": i for i in range(3)})
    assert fabric.islands == ((0, 1, 2),)
    assert fabric.island_links == {0: 18, 1: 18, 2: 18}


def test_inactive_links_do_not_count():
    doc = {"gpus": [_gpu(0, "0000:01:00.0", [{**_link(0, "0000:02:00.0", "gpu"), "active": False}]),
                    _gpu(1, "0000:02:00.0")]}
    fabric = build_fabric(parse_nvml_json(json.dumps(doc)), {"0000:01:00.0": 0, "0000:02:00.0": 1})
    assert fabric.links_between(0, 1) == 0
