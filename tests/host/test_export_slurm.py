"""Slurm gres.conf export: every field parsed back, and (when installed) slurmd -G agrees."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

import pytest

from topod.cpulist import parse_cpulist
from topod.export.slurm import gpu_type, gres_lines, render_gres_conf, slurm_core_indices
from topod.record import replace


@pytest.fixture(scope="module")
def topology_of(readonly_host):
    return lambda name: readonly_host(name)[1]



def parse_gres(text: str) -> list[dict[str, str]]:
    """gres.conf text -> one {Key: value} per GPU line (comments and AutoDetect lines skipped)."""
    rows = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(token.split("=", 1) for token in line.split())
        if "Name" in fields:
            rows.append(fields)
    return rows


def test_h800_lines_parse_back_with_every_field(topology_of):
    rows = parse_gres(render_gres_conf(topology_of("h800-8gpu")))
    assert len(rows) == 8
    for n, row in enumerate(rows):
        assert set(row) == {"Name", "Type", "File", "Cores", "Links"}
        assert row["Name"] == "gpu"
        assert row["Type"] == "nvidia_h800"
        assert row["File"] == f"/dev/nvidia{n}"
        links = [int(x) for x in row["Links"].split(",")]
        assert links[n] == -1 and len(links) == 8
        # NVSwitch: 8 links to every peer, where Slurm's own NVML plugin would write 0.
        assert [x for i, x in enumerate(links) if i != n] == [8] * 7
    assert [row["Cores"] for row in rows] == ["0-15"] * 4 + ["16-31"] * 4


def test_cores_are_slurm_core_indices_not_linux_cpu_ids(topology_of):
    topology = topology_of("h800-8gpu")
    # Node 1's Linux CPUs are 16-31 and their hyper-threads 48-63: sixteen cores, 16-31.
    assert topology.node(1).cpus == tuple(range(16, 32)) + tuple(range(48, 64))
    index = slurm_core_indices(topology)
    assert index[16] == index[48] == 16
    assert index[0] == index[32] == 0
    assert sorted(set(index.values())) == list(range(32))


def test_lines_are_in_pci_bus_order_and_links_columns_follow_it(topology_of):
    topology = topology_of("dgx1-cubemesh")
    lines = gres_lines(topology)
    by_address = sorted(topology.gpus, key=lambda g: g.address)
    assert [line.file for line in lines] == [g.device_file for g in by_address]
    fabric = topology.nvlink
    for i, line in enumerate(lines):
        for j, count in enumerate(line.links):
            a, b = by_address[i].index, by_address[j].index
            assert count == (-1 if a == b else fabric.links_between(a, b))


def test_links_matrix_is_symmetric_on_the_cube_mesh(topology_of):
    rows = [line.links for line in gres_lines(topology_of("dgx1-cubemesh"))]
    assert all(rows[i][j] == rows[j][i] for i in range(8) for j in range(8))
    assert rows[0] == (-1, 1, 1, 2, 2, 0, 0, 0)


def test_pcie_only_host_has_zero_links_and_cores_per_numa_node(topology_of):
    rows = parse_gres(render_gres_conf(topology_of("nps4-8gpu")))
    assert [row["Cores"] for row in rows] == ["0-7"] * 2 + ["8-15"] * 2 + ["16-23"] * 2 + ["24-31"] * 2
    assert all(set(row["Links"].split(",")) == {"-1", "0"} for row in rows)
    assert rows[0]["Type"] == "nvidia_a100-pcie-40gb"


def test_host_without_gpus_gets_only_comments(topology_of):
    text = render_gres_conf(topology_of("vm-nogpu"))
    assert parse_gres(text) == []
    assert "no GPUs" in text and "AutoDetect" not in text


def test_autodetect_is_turned_off_so_nvml_cannot_replace_the_links(topology_of):
    text = render_gres_conf(topology_of("pcie-8gpu"))
    assert "AutoDetect=off" in text.splitlines()
    assert "AutoDetect" not in render_gres_conf(topology_of("pcie-8gpu"), autodetect_off=False)


def test_node_name_prefixes_every_line(topology_of):
    text = render_gres_conf(topology_of("pcie-8gpu"), node_name="gpu[01]")
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body and all(line.startswith("NodeName=gpu[01] ") for line in body)


def test_unknown_gpu_name_and_numa_node_leave_type_and_cores_out(topology_of):
    topology = topology_of("pcie-8gpu")
    gpus = (replace(topology.gpus[0], name=None, numa_node=None),) + topology.gpus[1:]
    text = render_gres_conf(replace(topology, gpus=gpus))
    first = parse_gres(text)[0]
    assert "Type" not in first and "Cores" not in first
    assert "no Type=" in text and "no Cores=" in text


@pytest.mark.parametrize("name,expected", [
    ("NVIDIA H800", "nvidia_h800"),
    ("Tesla V100-SXM2-32GB", "tesla_v100-sxm2-32gb"),
    ("  NVIDIA  A100 80GB PCIe ", "nvidia_a100_80gb_pcie"),
    (None, None),
    ("", None),
])
def test_gpu_type_follows_slurm_autodetect_naming(name, expected):
    assert gpu_type(name) == expected


# --- slurmd -G: Slurm's own parser (Debian package slurmd) --------------------------

SLURMD = shutil.which("slurmd")


def _slurmd_check(tmp_path, topology, gres_text: str) -> str:
    host = socket.gethostname().split(".")[0]
    sockets = len({cpu.package for cpu in topology.cpus})
    cores = len(set(slurm_core_indices(topology).values()))
    threads = max(len(cpu.siblings) for cpu in topology.cpus)
    types = {line.type for line in gres_lines(topology)}
    gres = f"gpu:{types.pop()}:{len(topology.gpus)}" if len(types) == 1 else f"gpu:{len(topology.gpus)}"
    (tmp_path / "slurm.conf").write_text(
        "ClusterName=topodtest\nSlurmctldHost=localhost\nGresTypes=gpu\n"
        "SlurmdParameters=config_overrides\n"  # take the node's shape from here, not this machine
        f"NodeName={host} CPUs={len(topology.cpus)} Sockets={sockets} CoresPerSocket={cores // sockets} "
        f"ThreadsPerCore={threads} Gres={gres} State=UNKNOWN\n"
        f"PartitionName=p Nodes={host} Default=YES\n"
    )
    (tmp_path / "gres.conf").write_text(gres_text)
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf"))
    result = subprocess.run([SLURMD, "-G"], env=env, capture_output=True, text=True, timeout=60)
    return result.stdout + result.stderr


def _device_dir(tmp_path, count: int):
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in range(count):
        try:
            os.mknod(dev / f"nvidia{n}", 0o600 | 0o020000, os.makedev(195, n))  # slurmd wants char devices
        except PermissionError:
            pytest.skip("cannot create character devices here (needs root)")
    return dev


@pytest.mark.skipif(SLURMD is None, reason="slurmd not installed (Debian package slurmd)")
def test_slurmd_parses_the_h800_gres_conf_as_written(tmp_path, topology_of):
    topology = topology_of("h800-8gpu")
    dev = _device_dir(tmp_path, 8)
    text = render_gres_conf(topology, device_dir=str(dev))
    output = _slurmd_check(tmp_path, topology, text)
    assert not re.search(r"\b(error|fatal)\b", output), output
    seen = re.findall(r"Gres Name=gpu Type=(\S+) Count=1 Index=(\d+) .*File=(\S+) Cores=(\S+) CoreCnt=(\d+) "
                      r"Links=(\S+)", output)
    ours = parse_gres(text)
    assert len(seen) == 8
    for (kind, _, file, cores, core_count, links), row in zip(seen, ours):
        assert (kind, file, links) == (row["Type"], row["File"], row["Links"])
        assert parse_cpulist(cores) == parse_cpulist(row["Cores"])
        assert core_count == "64"  # slurmd prints the node's CPU count under this name


@pytest.mark.skipif(SLURMD is None, reason="slurmd not installed (Debian package slurmd)")
def test_slurmd_rejects_linux_cpu_ids_where_core_indices_belong(tmp_path, topology_of):
    # Node 1 as Linux CPU ids (16-31,48-63) is what a naive exporter writes; slurmd refuses it,
    # which is the evidence that Cores= takes core indices (topod writes 16-31).
    topology = topology_of("h800-8gpu")
    dev = _device_dir(tmp_path, 8)
    text = render_gres_conf(topology, device_dir=str(dev)).replace("Cores=16-31", "Cores=16-31,48-63", 1)
    assert "Invalid GRES data for gpu, Cores=16-31,48-63" in _slurmd_check(tmp_path, topology, text)
