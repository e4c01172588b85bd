import json

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
