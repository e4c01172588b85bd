import json
import re

from topod.cli.topoctl import main


def test_topo_json_has_the_documented_schema(host_tree, capsys):
    root = host_tree("h800-8gpu")
    assert main(["topo", "--root", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("numa_nodes", "cpus", "pci_devices", "gpus", "distance_matrix", "warnings", "nvlink"):
        assert key in doc
    node = doc["numa_nodes"][0]
    assert set(node) >= {"id", "cpus", "distances", "memory_bytes"}
    assert all(isinstance(c, int) for c in node["cpus"])
    cpu = doc["cpus"][0]
    assert set(cpu) >= {"id", "online", "core", "package", "numa_node", "siblings", "llc", "isolated"}
    device = doc["pci_devices"][0]
    assert set(device) >= {"address", "vendor", "device", "class", "kind", "driver", "parent", "numa_node",
                           "numa_node_source", "local_cpus", "link", "msi_irqs"}
    matrix = doc["distance_matrix"]
    assert len(matrix["levels"]) == len(matrix["devices"]) == 19
    assert matrix["levels"][0][1] == "NVS8"


def test_topo_text_shows_tree_and_matrix(host_tree, capsys):
    root = host_tree("pcie-8gpu")
    assert main(["topo", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "NUMA node 1: CPUs 12-23,36-47" in out
    assert "PCIe switch" in out and "GPU7" in out
    assert "PIX" in out and "SYS" in out


def test_topo_on_a_directory_that_is_not_a_host_tree_fails_clearly(tmp_path, capsys):
    assert main(["topo", "--root", str(tmp_path)]) == 1
    assert "not a host tree" in capsys.readouterr().err


def _smi_matrix(out: str) -> tuple[list[str], dict[str, list[str]]]:
    """Parse the matrix the way tools parse `nvidia-smi topo -m`: the header is the line
    naming 'CPU Affinity', split on whitespace; rows start with GPU<n> or NIC<n>."""
    lines = out.splitlines()
    header = next(line for line in lines if "CPU Affinity" in line and "NUMA Affinity" in line)
    columns = [word for word in header.split() if re.fullmatch(r"(GPU|NIC)\d+", word)]
    rows = {}
    for line in lines[lines.index(header) + 1:]:
        if not re.match(r"^(GPU|NIC)\d+\s", line):
            break
        fields = line.split()
        rows[fields[0]] = fields[1:]
    return columns, rows


def test_topo_matrix_parses_like_nvidia_smi_topo_m(host_tree, capsys):
    root = host_tree("h800-8gpu")
    assert main(["topo", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "CPU Affinity" in line)
    assert header.startswith("\tGPU0\tGPU1") and header.endswith("\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID")
    columns, rows = _smi_matrix(out)
    assert columns == [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(8)]
    assert list(rows) == columns  # square: one row per column, in order
    gpu0 = rows["GPU0"]
    assert gpu0[0] == "X" and all(re.fullmatch(r"NV\d+", cell) for cell in gpu0[1:8])  # NVSwitch: NV8, not NVS8
    assert gpu0[8] == "PIX" and gpu0[12] == "SYS"
    assert gpu0[16:] == ["0-15,32-47", "0", "N/A"]  # CPU Affinity, NUMA Affinity, GPU NUMA ID
    assert rows["GPU4"][16:] == ["16-31,48-63", "1", "N/A"]
    assert len(rows["NIC0"]) == 16  # NICs have no affinity columns, as in nvidia-smi
    assert "NVS" not in "".join(cell for row in rows.values() for cell in row)
    for legend in ("Legend:", "  X    = Self", "  SYS  = Connection traversing PCIe as well as the SMP interconnect",
                   "  NODE = ", "  PHB  = ", "  PXB  = ", "  PIX  = ",
                   "  NV#  = Connection traversing a bonded set of # NVLinks", "NVSwitch island",
                   "NIC Legend:", "  NIC0: mlx5_0", "  NIC7: mlx5_7"):
        assert legend in out, legend
    assert re.search(r"^  NVME0 nvme0 \S+: GPU0=\w+", out, re.M)  # NVMe kept, outside the matrix


def test_topo_matrix_without_nvlink_keeps_pcie_levels(host_tree, capsys):
    root = host_tree("pcie-8gpu")
    assert main(["topo", "--root", str(root)]) == 0
    columns, rows = _smi_matrix(capsys.readouterr().out)
    cells = {cell for label in columns if label.startswith("GPU") for cell in rows[label][:len(columns)]}
    assert {"X", "PIX", "SYS"} <= cells and not any(cell.startswith("NV") for cell in cells)
