"""`topoctl export ...` end to end against a host tree."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import yaml

from topod.cli.topoctl import main


@pytest.fixture(scope="module")
def h800(request, tmp_path_factory):
    """The h800 tree, shared with the other export tests (the CLI only reads it)."""
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host, load_builtin_spec

    cache = getattr(request.config, "_topod_export_hosts", None)
    if cache is None:
        cache = request.config._topod_export_hosts = {}
    if "h800-8gpu" not in cache:
        host = HostRoot(build_host(load_builtin_spec("h800-8gpu"), tmp_path_factory.mktemp("h800-8gpu")))
        cache["h800-8gpu"] = (host, discover(host, live_nvml=False))
    return str(cache["h800-8gpu"][0].root)


def test_export_nrt_prints_yaml_with_labels_and_leases(h800, capsys):
    rc = main(["export", "nrt", "--root", h800, "--node-name", "gpu01", "--label", "rack=r12",
               "--leased-gpus", "0-1", "--reserved-cpus", "0,32", "--policy", "single-numa-node"])
    assert rc == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    assert obj["metadata"]["name"] == "gpu01"
    gpu0 = next(r for r in obj["zones"][0]["resources"] if r["name"] == "nvidia.com/gpu")
    assert gpu0["available"] == 2
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs["topod.io/cluster.rack"] == "r12" and attrs["topologyManagerPolicy"] == "single-numa-node"


def test_node_name_comes_from_the_trees_hostname(tmp_path):
    from topod.cli.export_cmd import node_name_of
    from topod.host import HostRoot

    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/hostname").write_text("h800-a\n")
    host = HostRoot(tmp_path)
    assert node_name_of(host, None) == "h800-a"
    assert node_name_of(host, "given") == "given"
    (tmp_path / "proc/sys/kernel/hostname").write_text("GPU-Node7\n")
    assert node_name_of(host, None) == "gpu-node7"  # as the kubelet names its Node


@pytest.mark.parametrize("hostname", ["evil\nNodeName=x File=/dev/sda", "node_1", "a" * 254, "-lead", "x..y"])
def test_a_hostname_that_cannot_name_a_node_is_refused_not_exported(tmp_path, h800, hostname, capsys):
    """metadata.name must be an RFC 1123 subdomain, or the API server refuses the object."""
    import shutil

    root = tmp_path / "tree"
    shutil.copytree(h800, root, symlinks=True)
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/hostname").write_text(hostname + "\n")
    assert main(["export", "nrt", "--root", str(root)]) == 1
    captured = capsys.readouterr()
    assert "is not a Kubernetes Node name" in captured.err and captured.out == ""
    assert main(["export", "nrt", "--root", str(root), "--node-name", "gpu01.rack3"]) == 0
    assert "name: gpu01.rack3" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["a\nNodeName=b Name=gpu File=/dev/sda", "two words", "a=b", "a#b"])
def test_a_slurm_node_name_that_would_break_gres_conf_is_refused(h800, name, capsys):
    assert main(["export", "slurm-gres", "--root", h800, "--node-name", name]) == 1
    captured = capsys.readouterr()
    assert "cannot be a NodeName in gres.conf" in captured.err and captured.out == ""
    assert main(["export", "slurm-gres", "--root", h800, "--node-name", "tux[0-3]"]) == 0
    assert "NodeName=tux[0-3] AutoDetect=off" in capsys.readouterr().out


def test_export_nrt_json_is_the_same_object(h800, capsys):
    assert main(["export", "nrt", "--root", h800, "--node-name", "n1", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["metadata"]["name"] == "n1" and len(obj["zones"]) == 2


def test_export_nrt_without_a_hostname_asks_for_node_name(h800, capsys):
    assert main(["export", "nrt", "--root", h800]) == 1
    assert "--node-name" in capsys.readouterr().err


@pytest.mark.parametrize("argv,fragment", [
    (["--label", "Rack=r1"], "--label.Rack"),
    (["--label", "rack"], "expected KEY=VALUE"),
    (["--leased-gpus", "x"], "--leased-gpus"),
    (["--policy", "strict"], "topology_manager_policy"),
])
def test_export_nrt_bad_options_fail_with_a_clear_message(h800, capsys, argv, fragment):
    assert main(["export", "nrt", "--root", h800, "--node-name", "n", *argv]) == 1
    assert fragment in capsys.readouterr().err


def test_export_slurm_gres_prints_gres_conf_and_json(h800, capsys):
    assert main(["export", "slurm-gres", "--root", h800]) == 0
    text = capsys.readouterr().out
    assert "Name=gpu Type=nvidia_h800 File=/dev/nvidia0 Cores=0-15 Links=-1,8,8,8,8,8,8,8" in text
    assert main(["export", "slurm-gres", "--root", h800, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["gres"]
    assert len(rows) == 8 and rows[4]["cores"] == list(range(16, 32)) and rows[4]["links"][4] == -1


def test_export_nccl_writes_the_file_and_reports_it(h800, capsys, tmp_path):
    out = tmp_path / "nvidia-topologyd" / "virtualTopology.xml"
    assert main(["export", "nccl", "--root", h800, "--output", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["path"] == str(out) and report["gpus"] == list(range(8))
    root = ET.parse(out).getroot()
    assert len(list(root.iter("gpu"))) == 8 and len(list(root.iter("net"))) == 9


def test_export_nccl_on_a_tree_without_cpu_identity_warns_that_nccl_cannot_use_it(host_tree, capsys, tmp_path):
    tree = host_tree("h800-8gpu")
    (tree / "proc/cpuinfo").write_text("processor\t: 0\n\n")
    out = tmp_path / "topo.xml"
    assert main(["export", "nccl", "--root", str(tree), "--output", str(out)]) == 0  # written all the same
    err = capsys.readouterr().err
    assert "topoctl: warning: [nccl_cpu_identity_unknown] proc/cpuinfo:" in err
    assert "NUMA node(s) 0, 1 have no arch" in err and "Attribute arch of node cpu not found" in err
    assert all(cpu.get("arch") is None for cpu in ET.parse(out).getroot().iter("cpu"))
    assert main(["export", "nccl", "--root", _with_cpu_identity(tree), "--output", str(out)]) == 0
    assert "nccl_cpu_identity_unknown" not in capsys.readouterr().err


def _with_cpu_identity(tree):
    (tree / "proc/cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\n")
    return str(tree)


def test_export_nccl_lease_variant_prints_only_its_gpus(h800, capsys):
    assert main(["export", "nccl", "--root", h800, "--gpus", "2,3", "--cpus", "8-11"]) == 0
    root = ET.fromstring(capsys.readouterr().out)
    assert sorted(g.get("dev") for g in root.iter("gpu")) == ["2", "3"]
    assert root.find("cpu").get("affinity") == "00000f00"


def test_export_nccl_cpus_without_gpus_is_refused(h800, capsys):
    assert main(["export", "nccl", "--root", h800, "--cpus", "0-3"]) == 1
    assert "--gpus" in capsys.readouterr().err
