"""Huge page pools per NUMA node: discovery, the topology JSON, and NRT zone resources.

pcie-8gpu has node 0: 1024 x 2 MiB (1000 free) and 4 x 1 GiB (1 free); node 1: 512 x 2 MiB.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from topod.discover import discover
from topod.discover.hugepages import parse_hugepage_size, parse_page_count
from topod.export.nrt import binary_quantity, build_nrt, hugepage_resource_name
from topod.host import HostRoot
from topod.model import HugePages
from topod.topojson import topology_to_json

CRD = Path(__file__).resolve().parents[1] / "data" / "k8s" / "noderesourcetopology-crd.yaml"
MI2, GI1 = 2 << 20, 1 << 30


def _resources(zone) -> dict[str, dict]:
    return {r["name"]: r for r in zone["resources"]}


@pytest.mark.parametrize("name,size", [("hugepages-2048kB", 2048), ("hugepages-1048576kB", 1048576),
                                       ("hugepages-64kB", 64), ("hugepages-0kB", None), ("hugepages", None),
                                       ("hugepages-2048", None), ("x-2048kB", None)])
def test_size_directory_names(name, size):
    assert parse_hugepage_size(name) == size


def test_page_counts_parse_and_garbage_is_refused():
    assert parse_page_count("1024\n") == 1024
    for bad in ("-1", "lots", "", "1e3", str(1 << 41)):
        with pytest.raises(ValueError):
            parse_page_count(bad)


@pytest.mark.parametrize("value,text", [(0, "0"), (1536, "1536"), (1024, "1Ki"), (65536, "64Ki"),
                                        (MI2, "2Mi"), (GI1, "1Gi"), (3 * GI1, "3Gi"), (1536 * (1 << 20), "1536Mi"),
                                        (16 * GI1, "16Gi"), (1 << 40, "1Ti")])
def test_binary_quantities_are_the_kubelets_canonical_form(value, text):
    assert binary_quantity(value) == text


def test_resource_names_follow_the_kubelet():
    assert [hugepage_resource_name(s) for s in (2048, 1048576, 64, 32768)] == [
        "hugepages-2Mi", "hugepages-1Gi", "hugepages-64Ki", "hugepages-32Mi"]


def test_discovery_reads_each_nodes_pools(readonly_host):
    _, topology = readonly_host("pcie-8gpu")
    assert topology.node(0).hugepages == {2048: HugePages(1024, 1000), 1048576: HugePages(4, 1)}
    assert topology.node(1).hugepages == {2048: HugePages(512, 512), 1048576: HugePages(0, 0)}
    assert not [w for w in topology.warnings if "hugepages" in w.path]


def test_topology_json_has_numa_nodes_hugepages(readonly_host):
    _, topology = readonly_host("pcie-8gpu")
    node0 = topology_to_json(topology)["numa_nodes"][0]
    assert node0["hugepages"] == {"2048": {"total": 1024, "free": 1000}, "1048576": {"total": 4, "free": 1}}


def test_nrt_zones_carry_hugepages_in_bytes_and_memory_excludes_the_pools(readonly_host):
    _, topology = readonly_host("pcie-8gpu")
    zone0, zone1 = build_nrt(topology, "n")["zones"]
    r0, r1 = _resources(zone0), _resources(zone1)
    assert r0["hugepages-2Mi"] == {"name": "hugepages-2Mi", "capacity": 1024 * MI2, "allocatable": 1024 * MI2,
                                   "available": 1000 * MI2}
    assert r0["hugepages-1Gi"] == {"name": "hugepages-1Gi", "capacity": 4 * GI1, "allocatable": 4 * GI1,
                                   "available": GI1}
    assert (r1["hugepages-2Mi"]["capacity"], r1["hugepages-1Gi"]["capacity"]) == (512 * MI2, 0)
    memory = topology.node(0).memory_bytes
    assert r0["memory"]["capacity"] == memory
    assert r0["memory"]["allocatable"] == memory - 1024 * MI2 - 4 * GI1  # as the kubelet's allocatable


def test_nrt_with_hugepages_validates_against_the_crd(readonly_host):
    import jsonschema
    import yaml

    crd = yaml.safe_load(CRD.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")["schema"]["openAPIV3Schema"]
    obj = build_nrt(readonly_host("pcie-8gpu")[1], "n")
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(obj)] == []


def test_kernel_without_hugetlb_has_no_pools_and_no_warning(host_tree):
    import shutil

    root = host_tree("vm-nogpu")
    shutil.rmtree(root / "sys/devices/system/node/node0/hugepages")
    topology = discover(HostRoot(root), live_nvml=False)
    assert topology.node(0).hugepages == {}
    assert not [w for w in topology.warnings if "hugepages" in w.path]
    names = {r["name"] for r in build_nrt(topology, "vm")["zones"][0]["resources"]}
    assert names == {"cpu", "memory"}


def test_bad_counts_are_warned_and_never_guessed(host_tree):
    root = host_tree("vm-nogpu")
    base = root / "sys/devices/system/node/node0/hugepages"
    (base / "hugepages-2048kB/nr_hugepages").write_text("many\n")
    (base / "hugepages-1048576kB/nr_hugepages").write_text("2\n")
    (base / "hugepages-1048576kB/free_hugepages").write_text("9\n")
    topology = discover(HostRoot(root), live_nvml=False)
    assert topology.node(0).hugepages == {1048576: HugePages(2, 2)}
    bad = {w.path.rsplit("/", 2)[-2:][0]: w.code for w in topology.warnings if "hugepages" in w.path}
    assert bad == {"hugepages-2048kB": "bad_value", "hugepages-1048576kB": "bad_value"}
