"""`topoctl topo -m` prints the device matrix alone, as `nvidia-smi topo -m` users type
it; `topoctl leases ID` shows one lease whole: its CPUs, NICs and environment."""

from __future__ import annotations

import pytest

from topod.cli.topoctl import main


def test_topo_m_prints_the_matrix_alone(host_tree, tmp_path, capsys):
    root = host_tree("h800-8gpu")
    argv = ["--socket", str(tmp_path / "none.sock"), "topo", "--root", str(root)]
    assert main([*argv, "-m"]) == 0
    matrix = capsys.readouterr().out
    assert matrix.startswith("\tGPU0\tGPU1") and "CPU Affinity" in matrix.splitlines()[0]
    assert "NIC Legend:" in matrix and "NUMA node 0" not in matrix and not matrix.startswith("host ")
    assert main([*argv, "--matrix"]) == 0 and capsys.readouterr().out == matrix
    assert main(argv) == 0
    assert matrix in capsys.readouterr().out  # the whole view holds the same matrix
    assert main([*argv, "-m", "--json"]) == 2
    assert "--matrix" in capsys.readouterr().err


def test_topo_m_on_a_host_without_gpus_says_so(host_tree, tmp_path, capsys):
    root = host_tree("vm-nogpu")
    assert main(["--socket", str(tmp_path / "none.sock"), "topo", "--root", str(root), "-m"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no device matrix" in captured.err


def test_leases_id_shows_one_lease_with_its_cpus_nics_and_environment(daemon_factory, capsys):
    from topod.cpulist import format_cpulist

    daemon = daemon_factory()
    client = daemon.start()
    other = client.allocate(1, ttl_seconds=600)
    lease = client.allocate(2, ttl_seconds=600, job="train")
    assert main(["leases", "--socket", daemon.socket, lease["id"]]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"lease {lease['id']}  state active") and "job train" in out.splitlines()[0]
    assert f"  cpus {format_cpulist(lease['cpus'])}  memory nodes" in out
    for placement in lease["placements"]:
        nic = placement["nics"][0]
        assert f"GPU{placement['index']} " in out and f"{nic['name']}:{nic['port']} ({nic['level']})" in out
    assert "  environment:\n" in out
    for key, value in lease["environment"].items():
        assert f"\n    {key}={value}\n" in out
    assert other["id"] not in out
    assert main(["leases", "--socket", daemon.socket, "--json", lease["id"]]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["id"] == lease["id"]
    assert main(["leases", "--socket", daemon.socket, "0123456789abcdef"]) == 3
    with pytest.raises(SystemExit) as usage:
        main(["leases", "--socket", daemon.socket, "../health"])
    assert usage.value.code == 2
