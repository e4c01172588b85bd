"""The matrix's `GPU NUMA ID` column: the node holding each GPU's memory where the host
has one (Grace Hopper/Blackwell, as nvidia-smi prints it there), else N/A."""

from __future__ import annotations

import json
import re

from topod.cli.topoctl import main


def _smi_matrix(out: str) -> tuple[list[str], dict[str, list[str]]]:
    """Columns and rows as tools parse `nvidia-smi topo -m` (split on whitespace)."""
    lines = out.splitlines()
    header = next(line for line in lines if "CPU Affinity" in line and "GPU NUMA ID" in line)
    columns = [word for word in header.split() if re.fullmatch(r"(GPU|NIC)\d+", word)]
    rows = {}
    for line in lines[lines.index(header) + 1:]:
        if not re.match(r"^(GPU|NIC)\d+\s", line):
            break
        rows[line.split()[0]] = line.split()[1:]
    return columns, rows


def test_gpu_numa_id_is_each_gpus_memory_node_on_grace_hopper(host_tree, capsys):
    root = host_tree("grace-hopper-2gpu")
    assert main(["topo", "--root", str(root), "--socket", str(root / "none.sock")]) == 0
    columns, rows = _smi_matrix(capsys.readouterr().out)
    assert columns[:2] == ["GPU0", "GPU1"]
    # CPU Affinity, NUMA Affinity (the CPU node), GPU NUMA ID (the memory node)
    assert rows["GPU0"][-2:] == ["0", "2"]
    assert rows["GPU1"][-2:] == ["1", "10"]


def test_gpu_numa_id_is_na_where_gpu_memory_has_no_node(host_tree, capsys):
    root = host_tree("grace-hopper-2gpu")
    nvml = json.loads((root / "nvml.json").read_text())
    for gpu in nvml["gpus"]:
        del gpu["memory_numa_node"]
        gpu["memory_total_mib"] = 40960  # no node of that size either: the heuristic finds none
    (root / "nvml.json").write_text(json.dumps(nvml))
    assert main(["topo", "--root", str(root), "--socket", str(root / "none.sock")]) == 0
    _, rows = _smi_matrix(capsys.readouterr().out)
    assert [rows[g][-1] for g in ("GPU0", "GPU1")] == ["N/A", "N/A"]


def test_gpu_numa_id_stays_na_on_a_pcie_host(host_tree, capsys):
    root = host_tree("h800-8gpu")
    assert main(["topo", "--root", str(root), "--socket", str(root / "none.sock")]) == 0
    _, rows = _smi_matrix(capsys.readouterr().out)
    assert rows["GPU0"][-3:] == ["0-15,32-47", "0", "N/A"]
