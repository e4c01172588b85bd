"""`make test-gpu` (topod.conformance): the skip path on a host without GPUs, and the
comparison with captured `nvidia-smi topo -m` / `rocm-smi --showtopo` output against the
fixture hosts they describe (a GPU server itself is needed for the live comparison)."""

from __future__ import annotations

from pathlib import Path

import pytest

from topod.conformance.__main__ import main
from topod.conformance.compare import compare_amd, compare_nvidia
from topod.conformance.smi_text import parse_nvidia_topo, parse_rocm_topo
from topod.discover import discover
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec

SMI = Path(__file__).resolve().parents[1] / "data" / "smi"
NVIDIA_TEXT = (SMI / "h800-8gpu.nvidia-smi-topo-m.txt").read_text()
ROCM_TEXT = (SMI / "mi300x-8gpu.rocm-smi-showtopo.txt").read_text()


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    out = {}
    for name in ("h800-8gpu", "mi300x-8gpu", "vm-nogpu"):
        root = build_host(load_builtin_spec(name), tmp_path_factory.mktemp(name))
        out[name] = (root, discover(HostRoot(root), live_nvml=False))
    return out


def test_nvidia_smi_matrix_parses_cells_numa_and_nic_legend():
    smi = parse_nvidia_topo(NVIDIA_TEXT)
    assert smi.gpus == tuple(f"GPU{i}" for i in range(8)) and len(smi.labels) == 16
    assert smi.cells[("GPU0", "GPU1")] == "NV8" and smi.cells[("GPU0", "NIC0")] == "PIX"
    assert smi.cells[("GPU0", "GPU0")] == "X"
    assert smi.numa == {f"GPU{i}": i // 4 for i in range(8)}
    assert smi.nic_names["NIC7"] == "mlx5_7"


def test_rocm_smi_showtopo_parses_link_types_weights_and_numa():
    smi = parse_rocm_topo(ROCM_TEXT)
    assert smi.count == 8
    assert set(smi.link_type.values()) == {"XGMI"} and len(smi.link_type) == 56
    assert smi.weight[(0, 5)] == 15 and smi.hops[(0, 5)] == 1
    assert smi.numa == {i: i // 4 for i in range(8)}


def test_not_a_tool_output_is_a_clear_error():
    with pytest.raises(ValueError, match="GPU0"):
        parse_nvidia_topo("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    with pytest.raises(ValueError, match="Link Type"):
        parse_rocm_topo("ERROR: GPU[0] : Unable to get topology\n")


def test_fixtures_agree_with_what_the_vendor_tools_print(trees):
    assert compare_nvidia(trees["h800-8gpu"][1], parse_nvidia_topo(NVIDIA_TEXT)) == []
    assert compare_amd(trees["mi300x-8gpu"][1], parse_rocm_topo(ROCM_TEXT)) == []


def test_a_disagreement_is_named_pair_by_pair(trees):
    nvidia = NVIDIA_TEXT.replace("GPU0\t X \tNV8", "GPU0\t X \tPXB", 1).replace(
        "0-15,32-47\t0\t\tN/A", "0-15,32-47\t1\t\tN/A", 1)
    found = {m.what: (m.topod, m.tool) for m in compare_nvidia(trees["h800-8gpu"][1], parse_nvidia_topo(nvidia))}
    assert found == {"GPU0-GPU1": ("NV8", "PXB"), "GPU0 NUMA affinity": ("0", "1")}
    rocm = ROCM_TEXT.replace("GPU3   XGMI", "GPU3   PCIE", 1)
    (mismatch,) = compare_amd(trees["mi300x-8gpu"][1], parse_rocm_topo(rocm))
    assert (mismatch.what, mismatch.topod, mismatch.tool) == ("GPU3-GPU0 link type", "XGMI", "PCIE")


def test_nic_pairing_is_checked_against_the_nearest_nic_the_tool_shows(trees):
    # the tool puts NIC1, not NIC0, under GPU0's switch: topod's pairing (mlx5_0) disagrees
    swapped = NVIDIA_TEXT.replace("GPU0\t X \tNV8\tNV8\tNV8\tNV8\tNV8\tNV8\tNV8\tPIX\tPHB",
                                  "GPU0\t X \tNV8\tNV8\tNV8\tNV8\tNV8\tNV8\tNV8\tPHB\tPIX", 1)
    found = [m for m in compare_nvidia(trees["h800-8gpu"][1], parse_nvidia_topo(swapped)) if "pairing" in m.what]
    assert [(m.what, m.tool) for m in found] == [("GPU0 NIC pairing", "0000:18:00.0")]


def test_without_a_gpu_it_prints_one_skipped_line_and_succeeds(trees, capsys):
    assert main(["--root", str(trees["vm-nogpu"][0])]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("skipped: make test-gpu: no GPU on this host")


def test_a_gpu_host_without_its_tool_is_reported_unchecked(trees, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["--root", str(trees["mi300x-8gpu"][0])]) == 0
    assert "unchecked: amd GPUs: rocm-smi not found on PATH" in capsys.readouterr().out


def test_captured_outputs_compare_and_a_mismatch_fails_the_run(trees, capsys, tmp_path):
    root = str(trees["mi300x-8gpu"][0])
    assert main(["--root", root, "--rocm-smi-file", str(SMI / "mi300x-8gpu.rocm-smi-showtopo.txt")]) == 0
    assert "compared: amd GPUs against" in capsys.readouterr().out
    bad = tmp_path / "bad.txt"
    bad.write_text(ROCM_TEXT.replace("(Topology) Numa Node: 1", "(Topology) Numa Node: 0"))
    assert main(["--root", root, "--rocm-smi-file", str(bad)]) == 1
    assert "MISMATCH GPU4 NUMA node: topod says 1, the tool says 0" in capsys.readouterr().out


LINKS = Path(__file__).resolve().parents[1] / "fixtures" / "links"


@pytest.fixture(scope="module")
def pcie_host(tmp_path_factory):
    return build_host(load_builtin_spec("pcie-8gpu"), tmp_path_factory.mktemp("pcie-8gpu"))


def test_near_far_copies_agree_with_topods_numa_nodes_on_a_well_described_host(pcie_host, capsys):
    table = LINKS / "pcie-8gpu-uplink-degrades.json"  # its degradation starts 300 s in
    status = main(["--root", str(pcie_host), "--probe", f"simulated:{table}"])
    out = capsys.readouterr().out
    near_far = [line for line in out.splitlines() if line.startswith("near/far GPU")]
    assert status == 0 and len(near_far) == 8, out
    assert "compared: near/far copies of 8 GPU(s) through simulated: 0 mismatch(es)" in out
    assert "MISMATCH" not in out


def test_a_gpu_nearer_another_node_than_topod_says_is_a_mismatch(pcie_host, capsys):
    """The firmware puts GPU 3 on node 0; the link table says it really hangs off node 1:
    copies from node 1 are faster, and the check says so for GPU 3 alone."""
    status = main(["--root", str(pcie_host), "--probe", f"simulated:{LINKS / 'pcie-8gpu-gpu3-on-node1.json'}"])
    out = capsys.readouterr().out
    mismatches = [line for line in out.splitlines() if line.startswith("MISMATCH")]
    assert status == 1, out
    assert len(mismatches) == 1 and mismatches[0].startswith("MISMATCH GPU3 ") and "nearer node 1" in mismatches[0]


def test_a_probe_backend_that_cannot_open_leaves_the_check_unchecked_not_failed(pcie_host, capsys):
    pytest.importorskip("topod.probe.cuda")
    status = main(["--root", str(pcie_host), "--probe", "cuda"])
    out = capsys.readouterr().out
    try:
        import cuda  # noqa: F401
    except ImportError:
        assert status == 0 and "unchecked: near/far host-to-device copies: cuda:" in out, out
    else:  # pragma: no cover - a machine with cuda-python: the probe then opens or says why not
        assert "near/far" in out


def test_farthest_node_is_the_largest_slit_distance_and_none_with_one_node(trees):
    from topod.conformance.nearfar import farthest_node

    _, h800 = trees["h800-8gpu"]
    assert farthest_node(h800, 0) == 1 and farthest_node(h800, 1) == 0
    _, vm = trees["vm-nogpu"]  # one NUMA node
    (only,) = [node.id for node in vm.numa_nodes if node.cpus]
    assert farthest_node(vm, only) is None
