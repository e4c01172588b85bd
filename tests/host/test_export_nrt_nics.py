"""NRT export of RDMA NIC ports: per zone (NUMA node) when [alloc] nics = "exclusive"
(capacity every port, allocatable the ACTIVE ones, available those no lease holds), none
with shared or none; schema-valid either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topod.cli.export_cmd import leased_nic_keys
from topod.cli.topoctl import main
from topod.discover import discover
from topod.errors import ConfigError
from topod.export.nrt import NrtSettings, build_nrt
from topod.host import HostRoot

CRD = Path(__file__).resolve().parents[1] / "data" / "k8s" / "noderesourcetopology-crd.yaml"
NIC = "topod.io/rdma-nic"


@pytest.fixture(scope="module")
def validator():
    import jsonschema
    import yaml

    crd = yaml.safe_load(CRD.read_text())
    schema = {v["name"]: v for v in crd["spec"]["versions"]}["v1alpha2"]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def h800(readonly_host):
    return readonly_host("h800-8gpu")[1]


def _nics(obj) -> list[tuple[int, int, int] | None]:
    out = []
    for zone in obj["zones"]:
        found = [r for r in zone["resources"] if r["name"] == NIC]
        out.append((found[0]["capacity"], found[0]["allocatable"], found[0]["available"]) if found else None)
    return out


def _zone_attr(zone, name):
    return {a["name"]: a["value"] for a in zone.get("attributes", [])}.get(name)


def test_exclusive_nics_are_a_resource_per_zone_and_schema_valid(h800, validator):
    obj = build_nrt(h800, "node-a", nic_mode="exclusive")
    assert [e.message for e in validator.iter_errors(obj)] == []
    assert _nics(obj) == [(4, 4, 4), (4, 4, 4)]
    assert _zone_attr(obj["zones"][0], "topod.io/rdma-nics") == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"


def test_leased_nics_lower_available_in_their_zone_only(h800, validator):
    obj = build_nrt(h800, "node-a", nic_mode="exclusive",
                    leased_nics=["0000:14:00.0/1", "0000:54:00.0/1", "0000:58:00.0/1"])
    assert _nics(obj) == [(4, 4, 3), (4, 4, 2)]
    assert [e.message for e in validator.iter_errors(obj)] == []


@pytest.mark.parametrize("mode", ["shared", "none"])
def test_shared_or_no_nics_publish_no_nic_resource(h800, validator, mode):
    obj = build_nrt(h800, "node-a", nic_mode=mode, leased_nics=["0000:14:00.0/1", "0000:99:00.0/1"])
    assert _nics(obj) == [None, None]
    assert not any(_zone_attr(z, "topod.io/rdma-nics") for z in obj["zones"])
    assert [e.message for e in validator.iter_errors(obj)] == []


def _host(host_tree, root_complex):
    return discover(HostRoot(host_tree("h800-8gpu", root_complex=root_complex)), live_nvml=False)


def test_a_down_port_is_capacity_but_not_allocatable(host_tree):
    topology = _host(host_tree, [
        {"node": 0, "switches": [{"devices": ["gpu", {"kind": "rdma", "port_state": "DOWN"}]},
                                 {"devices": ["gpu", "rdma"]}]},
        {"node": 1, "switches": [{"devices": ["gpu", "rdma"]}]},
    ])
    assert _nics(build_nrt(topology, "n", nic_mode="exclusive")) == [(2, 1, 1), (1, 1, 1)]


def test_nics_on_one_socket_only_appear_in_that_zone_only(host_tree):
    topology = _host(host_tree, [
        {"node": 0, "switches": [{"devices": ["gpu"]}, {"devices": ["gpu"]}]},
        {"node": 1, "devices": ["rdma", "rdma"]},
    ])
    assert _nics(build_nrt(topology, "n", nic_mode="exclusive")) == [None, (2, 2, 2)]


def test_a_host_without_rdma_nics_has_no_nic_resource(readonly_host):
    assert _nics(build_nrt(readonly_host("vm-nogpu")[1], "n", nic_mode="exclusive")) == [None]


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"nic_mode": "exclusive", "leased_nics": ["0000:99:00.0/1"]}, "leased NIC ports 0000:99:00.0/1 are not on"),
    ({"nic_mode": "exclusive", "leased_nics": ["mlx5_0"]}, "leased NIC ports mlx5_0 are not on"),
    ({"nic_mode": "private"}, "[alloc] nics 'private' is not one of exclusive, shared, none"),
])
def test_bad_nic_input_is_a_clear_error(h800, kwargs, fragment):
    with pytest.raises(ConfigError) as caught:
        build_nrt(h800, "n", **kwargs)
    assert fragment in str(caught.value)


def test_the_nic_resource_name_must_be_an_extended_resource_name():
    with pytest.raises(ConfigError, match="nic_resource: 'rdma' is not an extended resource name"):
        NrtSettings(nic_resource="rdma")


def test_leased_nic_keys_come_from_the_lease_placements():
    leases = [{"id": "a", "placements": [{"gpu": 0, "nics": [{"name": "mlx5_0", "address": "0000:14:00.0",
                                                               "port": 1, "level": "PIX"}]},
                                         {"gpu": 1, "nics": []}]},
              {"id": "b", "placements": [{"gpu": 4}]}, {"id": "c"}]
    assert leased_nic_keys(leases) == ["0000:14:00.0/1"]


def test_export_nrt_cli_takes_the_mode_from_nics_or_config(host_tree, tmp_path, capsys):
    root = str(host_tree("h800-8gpu"))
    base = ["export", "nrt", "--root", root, "--node-name", "n", "--policy", "none", "--scope", "pod",
            "--socket", str(tmp_path / "none.sock")]
    assert main([*base, "--json", "--nics", "exclusive"]) == 0
    assert _nics(json.loads(capsys.readouterr().out)) == [(4, 4, 4), (4, 4, 4)]
    config = tmp_path / "topod.toml"
    config.write_text('[alloc]\nnics = "exclusive"\n')
    assert main([*base, "--json", "--config", str(config)]) == 0
    assert _nics(json.loads(capsys.readouterr().out)) == [(4, 4, 4), (4, 4, 4)]
    assert main([*base, "--json", "--config", str(config), "--nics", "shared"]) == 0, "--nics wins"
    assert _nics(json.loads(capsys.readouterr().out)) == [None, None]
    assert main(base) == 0
    captured = capsys.readouterr()
    assert NIC not in captured.out
    assert "no RDMA NIC resources published: [alloc] nics is shared (the default)" in captured.err
    config.write_text('[alloc]\nnics = "private"\n')
    assert main([*base, "--config", str(config)]) != 0
    assert "nics" in capsys.readouterr().err
