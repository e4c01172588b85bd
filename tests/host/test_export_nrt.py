"""NodeResourceTopology export: schema-valid, one zone per NUMA node, counts that add up."""

from __future__ import annotations

from pathlib import Path

import pytest

from topod.errors import ConfigError
from topod.export.nrt import NrtSettings, build_nrt

K8S_DATA = Path(__file__).resolve().parents[1] / "data" / "k8s"  # vendored (Apache-2.0, see LICENSE there)
CRD = K8S_DATA / "noderesourcetopology-crd.yaml"


@pytest.fixture(scope="module")
def topology_of(readonly_host):
    return lambda name: readonly_host(name)[1]



@pytest.fixture(scope="module")
def validator():
    import jsonschema
    import yaml

    crd = yaml.safe_load(CRD.read_text())
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    schema = versions["v1alpha2"]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


def _attrs(items) -> dict[str, str]:
    return {item["name"]: item["value"] for item in items}


def _resources(zone) -> dict[str, dict]:
    return {r["name"]: r for r in zone["resources"]}


@pytest.mark.parametrize("host", ["h800-8gpu", "nps4-8gpu", "vm-nogpu", "dgx1-cubemesh", "pcie-8gpu"])
def test_nrt_validates_against_the_v1alpha2_crd_schema(topology_of, validator, host):
    obj = build_nrt(topology_of(host), "node-a", leased_gpus=(), labels={"rack": "r1"})
    errors = [e.message for e in validator.iter_errors(obj)]
    assert errors == []


def test_schema_check_rejects_a_zone_without_type(topology_of, validator):
    obj = build_nrt(topology_of("h800-8gpu"), "node-a")
    del obj["zones"][0]["type"]
    assert any("'type' is a required property" in e.message for e in validator.iter_errors(obj))


@pytest.mark.parametrize("host,zones", [("h800-8gpu", 2), ("nps4-8gpu", 4), ("vm-nogpu", 1)])
def test_one_zone_per_numa_node_with_costs_from_slit(topology_of, host, zones):
    topology = topology_of(host)
    obj = build_nrt(topology, "node-a")
    assert [z["name"] for z in obj["zones"]] == [f"node-{i}" for i in range(zones)]
    for zone, node in zip(obj["zones"], sorted(topology.numa_nodes, key=lambda n: n.id)):
        assert zone["type"] == "Node"
        costs = {c["name"]: c["value"] for c in zone["costs"]}
        assert costs == {f"node-{k}": v for k, v in node.distances.items()}


def test_nps4_costs_keep_the_same_socket_cheaper_than_the_other(topology_of):
    zone0 = build_nrt(topology_of("nps4-8gpu"), "n")["zones"][0]
    costs = {c["name"]: c["value"] for c in zone0["costs"]}
    assert costs == {"node-0": 10, "node-1": 12, "node-2": 32, "node-3": 32}


@pytest.mark.parametrize("host,per_zone", [("h800-8gpu", [4, 4]), ("nps4-8gpu", [2, 2, 2, 2]), ("vm-nogpu", [0])])
def test_gpu_capacity_per_zone_matches_the_host(topology_of, host, per_zone):
    obj = build_nrt(topology_of(host), "node-a")
    counts = [_resources(z).get("nvidia.com/gpu", {}).get("capacity", 0) for z in obj["zones"]]
    assert counts == per_zone


def test_vm_without_gpus_has_no_gpu_resource_at_all(topology_of):
    zone = build_nrt(topology_of("vm-nogpu"), "vm")["zones"][0]
    assert set(_resources(zone)) == {"cpu", "memory"}
    assert _resources(zone)["cpu"]["capacity"] == 4


def test_leased_gpus_reduce_available_in_their_zone_only(topology_of):
    obj = build_nrt(topology_of("h800-8gpu"), "n", leased_gpus=[0, 1, 5])
    gpu0, gpu1 = (_resources(z)["nvidia.com/gpu"] for z in obj["zones"])
    assert (gpu0["capacity"], gpu0["allocatable"], gpu0["available"]) == (4, 4, 2)
    assert (gpu1["capacity"], gpu1["allocatable"], gpu1["available"]) == (4, 4, 3)


def test_reserved_and_leased_cpus_lower_allocatable_and_available(topology_of):
    obj = build_nrt(topology_of("h800-8gpu"), "n", reserved_cpus=[0, 32], leased_cpus=[1, 2, 3, 16])
    cpu0, cpu1 = (_resources(z)["cpu"] for z in obj["zones"])
    assert (cpu0["capacity"], cpu0["allocatable"], cpu0["available"]) == (32, 30, 27)
    assert (cpu1["capacity"], cpu1["allocatable"], cpu1["available"]) == (32, 32, 31)
    assert _attrs(obj["zones"][0]["attributes"])["topod.io/withheld-cpus"] == "0,32"


def test_a_reserved_cpu_that_is_also_leased_is_not_counted_twice(topology_of):
    cpu0 = _resources(build_nrt(topology_of("h800-8gpu"), "n", reserved_cpus=[0], leased_cpus=[0])["zones"][0])["cpu"]
    assert (cpu0["allocatable"], cpu0["available"]) == (31, 31)


def test_isolated_cpus_are_not_allocatable(topology_of):
    import dataclasses

    topology = topology_of("h800-8gpu")
    cpus = tuple(dataclasses.replace(c, isolated=c.id in (4, 5, 6, 7)) for c in topology.cpus)
    topology = dataclasses.replace(topology, cpus=cpus)
    assert topology.isolated_cpus == (4, 5, 6, 7)
    cpu0 = _resources(build_nrt(topology, "n")["zones"][0])["cpu"]
    assert (cpu0["capacity"], cpu0["allocatable"]) == (32, 28)


def test_memory_resource_reports_the_nodes_bytes_minus_reserved(topology_of):
    obj = build_nrt(topology_of("h800-8gpu"), "n", reserved_memory={1: 2 << 30})
    mem0, mem1 = (_resources(z)["memory"] for z in obj["zones"])
    assert mem0["capacity"] == mem0["allocatable"] == 1 << 40
    assert mem1["allocatable"] == (1 << 40) - (2 << 30)


def test_attributes_carry_nvswitch_islands_switch_groups_levels_and_labels(topology_of):
    obj = build_nrt(topology_of("h800-8gpu"), "n", labels={"rack": "r12", "leaf": "l3"})
    top = _attrs(obj["attributes"])
    assert top["topod.io/nvswitch-islands"] == "0-7"
    assert top["topod.io/pcie-switch-groups"] == "0;1;2;3;4;5;6;7"
    assert top["topod.io/cluster.rack"] == "r12" and top["topod.io/cluster.leaf"] == "l3"
    zone0 = _attrs(obj["zones"][0]["attributes"])
    assert zone0["topod.io/gpus"] == "0,1,2,3"
    assert zone0["topod.io/gpu0-bus"] == "0000:13:00.0"
    assert zone0["topod.io/gpu0-levels"].split(",") == ["X"] + ["NVS8"] * 7


def test_pcie_host_groups_two_gpus_per_switch_and_has_no_nvlink_attributes(topology_of):
    top = _attrs(build_nrt(topology_of("pcie-8gpu"), "n")["attributes"])
    assert top["topod.io/pcie-switch-groups"] == "0,1;2,3;4,5;6,7"
    assert "topod.io/nvswitch-islands" not in top and "topod.io/nvlink-pairs" not in top


def test_cube_mesh_publishes_direct_nvlink_pairs(topology_of):
    top = _attrs(build_nrt(topology_of("dgx1-cubemesh"), "n")["attributes"])
    pairs = dict(item.split(":") for item in top["topod.io/nvlink-pairs"].split(","))
    assert pairs["0-3"] == "2" and pairs["0-1"] == "1" and "0-5" not in pairs


@pytest.mark.parametrize("policy,scope,legacy", [
    ("none", "container", "None"),
    ("single-numa-node", "container", "SingleNUMANodeContainerLevel"),
    ("single-numa-node", "pod", "SingleNUMANodePodLevel"),
    ("restricted", "pod", "RestrictedPodLevel"),
    ("best-effort", "container", "BestEffortContainerLevel"),
])
def test_topology_manager_policy_is_published_both_ways(topology_of, policy, scope, legacy):
    obj = build_nrt(topology_of("vm-nogpu"), "n", settings=NrtSettings(policy, scope))
    top = _attrs(obj["attributes"])
    assert (top["topologyManagerPolicy"], top["topologyManagerScope"]) == (policy, scope)
    assert obj["topologyPolicies"] == [legacy]


def test_object_header_names_the_node(topology_of):
    obj = build_nrt(topology_of("vm-nogpu"), "worker-7")
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert obj["kind"] == "NodeResourceTopology"
    assert obj["metadata"] == {"name": "worker-7"}


@pytest.mark.parametrize("kwargs,fragment", [
    ({"topology_manager_policy": "strict"}, "topology_manager_policy"),
    ({"topology_manager_scope": "node"}, "topology_manager_scope"),
    ({"gpu_resource": "gpu"}, "gpu_resource"),
])
def test_bad_settings_name_the_key(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        NrtSettings(**kwargs)


def test_leasing_a_gpu_the_host_lacks_is_an_error(topology_of):
    with pytest.raises(ConfigError, match=r"\[9\]"):
        build_nrt(topology_of("h800-8gpu"), "n", leased_gpus=[9])


def test_empty_node_name_is_an_error(topology_of):
    with pytest.raises(ConfigError, match="node name"):
        build_nrt(topology_of("vm-nogpu"), "")
