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
    # Empty huge page pools are listed, as the kubelet lists them in the node's capacity.
    assert set(_resources(zone)) == {"cpu", "memory", "hugepages-2Mi", "hugepages-1Gi"}
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
    from topod.record import replace

    topology = topology_of("h800-8gpu")
    cpus = tuple(replace(c, isolated=c.id in (4, 5, 6, 7)) for c in topology.cpus)
    topology = replace(topology, cpus=cpus)
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


# --- the kubelet's topology manager settings (topod.export.kubelet) -------------------

KUBEADM_CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false   # topologyManagerPolicy: restricted (a comment, not a key)
clusterDNS:
- 10.96.0.10
cpuManagerPolicy: static
reservedSystemCPUs: "0,32"
topologyManagerPolicy: "single-numa-node"   # must match the NRT object
topologyManagerScope: 'pod'
featureGates: {TopologyManagerPolicyOptions: true}
"""


def _tm(text):
    from topod.export.kubelet import topology_manager_from_text
    from topod.export.nrt import POLICIES, SCOPES

    return topology_manager_from_text(text, "/var/lib/kubelet/config.yaml", POLICIES, SCOPES)


def test_kubelet_config_parser_reads_top_level_keys_only():
    from topod.export.kubelet import parse_kubelet_config

    keys = parse_kubelet_config(KUBEADM_CONFIG)
    assert keys["topologyManagerPolicy"] == "single-numa-node" and keys["topologyManagerScope"] == "pod"
    assert keys["kind"] == "KubeletConfiguration" and keys["reservedSystemCPUs"] == "0,32"
    assert "anonymous" not in keys and "enabled" not in keys


@pytest.mark.parametrize("text", ["just some words\n", "- a\n- b\n", "\x00\x01\x02", "", "# only a comment\n",
                                  "{not json", "[1, 2]\n", "key:value\n"])
def test_kubelet_config_parser_refuses_what_is_not_a_mapping(text):
    from topod.export.kubelet import parse_kubelet_config

    with pytest.raises(ValueError):
        parse_kubelet_config(text)


def test_kubelet_config_policy_and_scope_are_read():
    found = _tm(KUBEADM_CONFIG)
    assert (found.policy, found.scope, found.source, found.warnings) == ("single-numa-node", "pod",
                                                                         "kubelet-config", ())


def test_kubelet_config_in_json_is_read_too():
    found = _tm('{"kind": "KubeletConfiguration", "topologyManagerPolicy": "restricted"}')
    assert (found.policy, found.scope, found.warnings) == ("restricted", "container", ())


def test_kubelet_config_without_the_keys_means_the_kubelet_defaults_without_warning():
    found = _tm("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
    assert (found.policy, found.scope, found.warnings) == ("none", "container", ())


@pytest.mark.parametrize("text,fragment", [
    ("this is not yaml at all\n", "not a top-level"),
    ("kind: Pod\ntopologyManagerPolicy: restricted\n", "not KubeletConfiguration"),
    ("topologyManagerPolicy: strict\n", "'strict' is not one of"),
])
def test_garbage_kubelet_config_gives_none_and_a_warning(text, fragment):
    found = _tm(text)
    assert found.policy == "none" and found.scope == "container"
    assert [w.code for w in found.warnings] == ["kubelet_config_invalid"]
    assert fragment in found.warnings[0].reason


def _kubelet_tree(host_tree, text=None, path="var/lib/kubelet/config.yaml"):
    root = host_tree("vm-nogpu")
    if text is not None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_missing_kubelet_config_gives_none_and_a_warning(host_tree):
    from topod.export.kubelet import resolve_topology_manager
    from topod.export.nrt import POLICIES, SCOPES
    from topod.host import HostRoot

    found = resolve_topology_manager(HostRoot(_kubelet_tree(host_tree)), "/var/lib/kubelet/config.yaml",
                                     "auto", "auto", POLICIES, SCOPES)
    assert (found.policy, found.scope, found.source) == ("none", "container", "default")
    assert [w.code for w in found.warnings] == ["kubelet_config_missing"]


def test_explicit_options_override_the_kubelet_config(host_tree):
    from topod.export.kubelet import resolve_topology_manager
    from topod.export.nrt import POLICIES, SCOPES
    from topod.host import HostRoot

    host = HostRoot(_kubelet_tree(host_tree, KUBEADM_CONFIG))
    path = "/var/lib/kubelet/config.yaml"
    both = resolve_topology_manager(host, path, "best-effort", "container", POLICIES, SCOPES)
    assert (both.policy, both.scope, both.source) == ("best-effort", "container", "option")
    half = resolve_topology_manager(host, path, "restricted", "auto", POLICIES, SCOPES)
    assert (half.policy, half.scope, half.source) == ("restricted", "pod", "option+kubelet-config")


def test_export_nrt_cli_reads_the_kubelet_config_by_default(host_tree, capsys):
    import json

    from topod.cli.topoctl import main

    root = str(_kubelet_tree(host_tree, KUBEADM_CONFIG))
    assert main(["export", "nrt", "--root", root, "--node-name", "n", "--json"]) == 0
    captured = capsys.readouterr()
    obj = json.loads(captured.out)
    top = _attrs(obj["attributes"])
    assert (top["topologyManagerPolicy"], top["topologyManagerScope"]) == ("single-numa-node", "pod")
    assert top["topod.io/topology-manager-source"] == "kubelet-config"
    assert obj["topologyPolicies"] == ["SingleNUMANodePodLevel"]
    assert "kubelet_config" not in captured.err


def test_export_nrt_cli_custom_kubelet_config_path_and_missing_file_warning(host_tree, capsys):
    import json

    from topod.cli.topoctl import main

    root = str(_kubelet_tree(host_tree, "kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n",
                             path="etc/kubernetes/kubelet.yaml"))
    assert main(["export", "nrt", "--root", root, "--node-name", "n", "--json",
                 "--kubelet-config", "/etc/kubernetes/kubelet.yaml"]) == 0
    assert _attrs(json.loads(capsys.readouterr().out)["attributes"])["topologyManagerPolicy"] == "restricted"
    assert main(["export", "nrt", "--root", root, "--node-name", "n", "--json"]) == 0
    captured = capsys.readouterr()
    assert _attrs(json.loads(captured.out)["attributes"])["topologyManagerPolicy"] == "none"
    warnings = [json.loads(line)["warning"] for line in captured.err.splitlines() if '"warning"' in line]
    assert [w["code"] for w in warnings] == ["kubelet_config_missing"]
    assert main(["export", "nrt", "--root", root, "--node-name", "n", "--policy", "none", "--scope", "pod"]) == 0
    assert "kubelet_config" not in capsys.readouterr().err  # both given: the file is not read
