"""Doctor's GPU-NIC check on fixture hosts read through HostRoot: a rank whose NCCL_IB_HCA or
UCX_NET_DEVICES names only NICs on another root complex or node than its GPU's nearest is a
finding with the near NIC in the fix; an unreadable environ is "not checked", never "ok"."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from topod.cli.doctor_cmd import EXIT_FINDINGS
from topod.cli.topoctl import main
from topod.discover import discover
from topod.doctor import diagnose, render_text, report_to_json
from topod.doctor.nics import parse_nccl_ib_hca, parse_ucx_net_devices
from topod.doctor.procs import ENVIRON_CAP
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.hostspec.doctor_scene import far_nic_rank, nic_at, nic_env_rank, well_placed_rank, write_process

NIC_CODES = ("nic_far", "nic_unknown", "nic_unpinned")


@pytest.fixture(scope="module")
def base_h800(tmp_path_factory):
    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path_factory.mktemp("doctor-nics") / "h800-8gpu")
    return root, discover(HostRoot(root), live_nvml=False)


@pytest.fixture()
def h800(base_h800, tmp_path):
    """A fresh root per test: its own proc/, the base tree's sys/ and dev/."""
    base, topology = base_h800
    root = tmp_path / "h800-8gpu"
    root.mkdir()
    shutil.copytree(base / "proc", root / "proc", ignore=shutil.ignore_patterns("irq"))
    for name in ("sys", "dev", "nvml.json", "proc/irq"):
        (root / name).symlink_to(base / name)
    return root, topology


def run(root, topology, **kwargs):
    return diagnose(HostRoot(root), topology, use_nvml=False, **kwargs)


def nic_findings(report):
    return [f for f in report.findings if f.code in NIC_CODES]


# ---------------------------------------------------------------- the variables, parsed as NCCL and UCX do


@pytest.mark.parametrize(("text", "selected"), [
    ("mlx5_1", {"mlx5_1:1", "mlx5_10:1"}),  # no '=': a prefix, as NCCL's strncmp
    ("=mlx5_1", {"mlx5_1:1"}),
    ("=mlx5_1:2", set()),  # a port the device does not have
    ("^=mlx5_1", {"mlx5_0:1", "mlx5_10:1"}),
    ("^mlx5_1", {"mlx5_0:1"}),
    ("=mlx5_0:1,mlx5_10:1", {"mlx5_0:1", "mlx5_10:1"}),
    ("=mlx5_0:x", set()),  # a port that is not a number matches nothing
])
def test_nccl_ib_hca_selects_as_nccl_does(text, selected):
    selector = parse_nccl_ib_hca(text)
    assert not selector.everything
    assert {f"{n}:1" for n in ("mlx5_0", "mlx5_1", "mlx5_10") if selector.selects(n, 1)} == selected


@pytest.mark.parametrize(("text", "everything"), [("", True), ("=", True), ("^", False)])
def test_an_empty_nccl_list_selects_everything_and_a_bare_exclude_nothing(text, everything):
    selector = parse_nccl_ib_hca(text)
    assert selector.everything is everything and selector.selects("mlx5_0", 1) is everything


def test_ucx_net_devices_names_exact_device_ports():
    assert parse_ucx_net_devices("all").everything and parse_ucx_net_devices("").everything
    pinned = parse_ucx_net_devices("mlx5_1:1,eth0")
    assert pinned.selects("mlx5_1", 1) and not pinned.selects("mlx5_10", 1) and not pinned.selects("mlx5_1", 2)
    assert not parse_ucx_net_devices("mlx5_1").selects("mlx5_1", 1), "a UCX RDMA device is named with :port"
    excluded = parse_ucx_net_devices("^mlx5_1:1")
    assert excluded.selects("mlx5_0", 1) and not excluded.selects("mlx5_1", 1)


# ---------------------------------------------------------------- on the seed's h800 (GPU i beside mlx5_i)


def test_a_rank_pinned_to_its_own_nic_is_ok(h800):
    root, topology = h800
    spec = well_placed_rank(topology, 4100, 0)
    assert spec.env["NCCL_IB_HCA"] == "=mlx5_0:1"
    write_process(root, spec)
    report = run(root, topology)
    assert nic_findings(report) == [] and report.processes[0].nic_status == "ok"
    assert report_to_json(report)["processes"][0]["nic_pairing"] == "ok"
    assert "NCCL/UCX pinned to no far NIC" in render_text(report)


def test_a_nic_on_the_other_socket_is_an_error_whose_fix_names_the_near_nic(h800):
    root, topology = h800
    write_process(root, far_nic_rank(topology, 4100, 0, "SYS"))
    report = run(root, topology)
    [finding] = nic_findings(report)
    assert (finding.severity, finding.code, finding.pid) == ("error", "nic_far", 4100)
    assert finding.evidence["far"] == {"0": "SYS"} and finding.evidence["selected"] == ["mlx5_4:1"]
    assert finding.evidence["nearest"] == {"0": ["mlx5_0:1"]}
    assert "NCCL_IB_HCA==mlx5_0:1" in finding.fix and "UCX_NET_DEVICES=mlx5_0:1" in finding.fix
    assert "topoctl bind" in finding.fix
    assert "/proc/4100/environ" in finding.files_read
    assert "/sys/bus/pci/devices/0000:54:00.0/infiniband/mlx5_4/ports/1/state" in finding.files_read
    assert not report.healthy


def test_a_nic_on_another_root_complex_of_the_same_node_is_a_warning(h800):
    root, topology = h800
    write_process(root, far_nic_rank(topology, 4100, 0, "NODE"))
    [finding] = nic_findings(run(root, topology))
    assert (finding.severity, finding.code) == ("warning", "nic_far") and finding.evidence["far"] == {"0": "NODE"}
    assert "another root complex" in finding.message


def test_a_nic_under_the_same_root_complex_is_not_far(h800):
    root, topology = h800
    nic = nic_at(topology, 0, "PHB")
    write_process(root, nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": f"={nic.name}:{nic.port}"}))
    assert nic_findings(run(root, topology)) == []


@pytest.mark.parametrize("value", ["mlx5", "^=mlx5_4,mlx5_5", "=mlx5_4:1,mlx5_0:1"])
def test_a_selection_that_still_holds_the_near_nic_is_ok(h800, value):
    root, topology = h800
    write_process(root, nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": value}))
    report = run(root, topology)
    assert nic_findings(report) == [] and report.processes[0].nic_status == "ok"


def test_excluding_the_near_nics_leaves_only_far_ones(h800):
    root, topology = h800
    write_process(root, nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": "^=mlx5_0,mlx5_1,mlx5_2,mlx5_3"}))
    [finding] = nic_findings(run(root, topology))
    assert finding.severity == "error" and finding.evidence["far"] == {"0": "SYS"}


def test_ucx_is_judged_apart_from_nccl(h800):
    root, topology = h800
    write_process(root, nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": "=mlx5_0:1", "UCX_NET_DEVICES": "mlx5_6:1"}))
    [finding] = nic_findings(run(root, topology))
    assert finding.evidence["variable"] == "UCX_NET_DEVICES" and finding.code == "nic_far"


@pytest.mark.parametrize("env", [{"NCCL_IB_HCA": "=mlx5_9:1"}, {"UCX_NET_DEVICES": "eth0"}])
def test_a_variable_naming_no_rdma_port_of_the_host_is_an_error(h800, env):
    root, topology = h800
    write_process(root, nic_env_rank(topology, 4100, 0, env))
    [finding] = nic_findings(run(root, topology))
    assert (finding.severity, finding.code) == ("error", "nic_unknown")
    assert "falls back to sockets/TCP" in finding.message and "NCCL_IB_HCA==mlx5_0:1" in finding.fix


def test_an_unpinned_rank_beside_a_nic_is_told_which_one_as_info(h800):
    root, topology = h800
    write_process(root, nic_env_rank(topology, 4100, 0, {}))
    report = run(root, topology)
    [finding] = nic_findings(report)
    assert (finding.severity, finding.code) == ("info", "nic_unpinned")
    assert "NCCL_IB_HCA==mlx5_0:1" in finding.fix and report.healthy, "advice, not a fault"


def test_a_multi_gpu_process_needs_a_near_nic_for_each_gpu(h800):
    root, topology = h800
    spec = nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": "=mlx5_0:1"})
    write_process(root, replace(spec, gpus=(0, 4)))  # holds /dev/nvidia0 and /dev/nvidia4 open
    [finding] = nic_findings(run(root, topology))
    assert finding.evidence["far"] == {"4": "SYS"} and "NCCL_IB_HCA==mlx5_0:1,mlx5_4:1" in finding.fix


# ---------------------------------------------------------------- not checked, never "ok"


def _unreadable(root, how):
    environ = root / "proc/4100/environ"
    if how == "missing":
        environ.unlink()
    elif how == "too_large":
        environ.write_bytes(b"NCCL_IB_HCA==mlx5_4:1\0" + b"X=" + b"y" * ENVIRON_CAP + b"\0")
    else:  # a FIFO: HostRoot reads regular files only (and never blocks)
        environ.unlink()
        import os

        os.mkfifo(environ)


@pytest.mark.parametrize("how", ["missing", "too_large", "fifo"])
def test_an_unreadable_environ_is_not_checked_never_ok(h800, capsys, how):
    root, topology = h800
    write_process(root, far_nic_rank(topology, 4100, 0, "SYS"))
    _unreadable(root, how)
    report = run(root, topology)
    process = report.processes[0]
    assert process.nic_status == "not_checked" and nic_findings(report) == []
    assert report.unchecked_processes == 1 and report_to_json(report)["processes"][0]["nic_pairing"] == "not_checked"
    text = render_text(report)
    assert "not checked: which RDMA NICs it sends through (/proc/4100/environ could not be read" in text
    assert "pinned to no far NIC" not in text and text.rstrip().endswith("— 1 process(es) not checked")


# ---------------------------------------------------------------- other hosts


def _h800_with(host_tree, root_complex):
    root = host_tree("h800-8gpu", root_complex=root_complex)
    return root, discover(HostRoot(root), live_nvml=False)


def test_nics_on_the_other_socket_only_are_the_nearest_there_are(host_tree):
    root, topology = _h800_with(host_tree, [
        {"node": 0, "switches": [{"devices": ["gpu"]}, {"devices": ["gpu"]}]},
        {"node": 1, "devices": ["rdma", "rdma"]},
    ])
    nic = nic_at(topology, 0, "SYS")
    write_process(root, nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": f"={nic.name}:{nic.port}"}))
    write_process(root, nic_env_rank(topology, 4110, 1, {}))
    report = run(root, topology)
    assert nic_findings(report) == [], "no nearer NIC exists: nothing to fix, and no near NIC to pin"
    assert [p.nic_status for p in report.processes] == ["ok", "ok"]


def test_a_host_without_rdma_nics_has_nothing_to_check(host_tree):
    root, topology = _h800_with(host_tree, [{"node": 0, "switches": [{"devices": ["gpu"]}]}])
    write_process(root, nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": "=mlx5_0:1"}))
    report = run(root, topology)
    assert nic_findings(report) == [] and report.processes[0].nic_status == "none"
    assert report.unchecked_processes == 0


def test_a_nic_whose_port_is_down_is_not_a_near_nic(host_tree):
    root, topology = _h800_with(host_tree, [
        {"node": 0, "switches": [{"devices": ["gpu", {"kind": "rdma", "port_state": "DOWN"}]},
                                 {"devices": ["gpu", "rdma"]}]},
    ])
    down = next(d for d in topology.devices_of_kind("rdma") if not d.rdma_ports[0].active)
    name = down.rdma_ports[0].device
    write_process(root, nic_env_rank(topology, 4100, 0, {"NCCL_IB_HCA": f"={name}:1"}))
    [finding] = nic_findings(run(root, topology))
    assert finding.code == "nic_unknown", "a down port carries nothing"
    other = nic_at(topology, 0, "PHB")
    assert f"NCCL_IB_HCA=={other.name}:1" in finding.fix


def test_topoctl_doctor_exits_with_findings_and_prints_the_fix(base_h800, tmp_path, capsys):
    base, topology = base_h800
    root = tmp_path / "h800-8gpu"
    shutil.copytree(base, root, symlinks=True)  # topoctl discovers the tree itself: a whole copy
    write_process(root, far_nic_rank(topology, 4100, 0, "SYS"))
    assert main(["doctor", "--root", str(root), "--socket", str(root / "none.sock")]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert "ERROR   nic_far: pid 4100 (python3) has NCCL_IB_HCA==mlx5_4:1" in out
    assert "fix:  relaunch with NCCL_IB_HCA==mlx5_0:1 UCX_NET_DEVICES=mlx5_0:1" in out
    assert main(["doctor", "--root", str(root), "--socket", str(root / "none.sock"), "--json"]) == EXIT_FINDINGS
    doc = json.loads(capsys.readouterr().out)
    assert doc["processes"][0]["env"]["NCCL_IB_HCA"] == "=mlx5_4:1" and doc["counts"]["error"] == 1
