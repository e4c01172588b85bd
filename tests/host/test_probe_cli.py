"""`topoctl links` against host trees with the simulated backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topod.cli.links_cmd import render_links
from topod.cli.topoctl import main
from topod.hostspec import build_host, load_builtin_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
LYING_ROOT_COMPLEXES = [  # as in test_probe_calibrate: GPU 3 on node 1, firmware says node 0
    {"node": 0, "switches": [{"devices": ["gpu", "gpu"]}, {"devices": ["gpu"]}], "devices": ["rdma", "nvme"]},
    {"node": 1, "bus": 0x28, "devices": [{"kind": "gpu", "firmware_numa_node": 0}]},
    {"node": 1, "bus": 0x30, "switches": [{"devices": ["gpu", "gpu"]}, {"devices": ["gpu", "gpu"]}],
     "devices": ["rdma", "nic"]},
]


@pytest.fixture(scope="module")
def lying_root(tmp_path_factory):
    spec = load_builtin_spec("pcie-8gpu")
    spec["root_complex"] = LYING_ROOT_COMPLEXES
    return str(build_host(spec, tmp_path_factory.mktemp("lying")))


def test_json_shows_expected_vs_measured_and_the_firmware_finding(lying_root, capsys):
    table = FIXTURES / "pcie-8gpu-gpu3-on-node1.json"
    assert main(["links", "--root", lying_root, "--json", "--backend", f"simulated:{table}", "--rounds", "2"]) == 0
    document = json.loads(capsys.readouterr().out)
    gpu3 = next(address for address, index in document["gpus"].items() if index == 3)
    row = next(r for r in document["links"] if r["link"] == f"h2d/node1/{gpu3}")
    assert row["expected"] == "remote (device on node0)" and row["measured_gbps"] > 20
    assert (row["probe_samples"], row["telemetry_samples"], row["state"]) == (2, 0, "ok")
    assert row["age_s"] is not None and row["age_s"] >= 0
    (finding,) = document["findings"]
    assert finding["code"] == "firmware_locality_mismatch" and finding["subject"] == gpu3


def test_text_names_gpus_and_prints_findings(lying_root, capsys):
    table = FIXTURES / "pcie-8gpu-gpu3-on-node1.json"
    assert main(["links", "--root", lying_root, "--backend", f"simulated:{table}", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "h2d node1 -> gpu3" in out and "remote (device on node0)" in out
    assert "[firmware_locality_mismatch]" in out and "using node 1" in out


def test_render_links_shows_corrections_by_gpu_name():
    document = {"gpus": {"0000:13:00.0": 0, "0000:17:00.0": 2},
                "links": [{"link": "p2p/0000:13:00.0/0000:17:00.0", "expected": "PXB", "measured_gbps": 5.5,
                           "healthy_gbps": 22.0, "latency_us": 2.1, "probe_samples": 4, "telemetry_samples": 1,
                           "age_s": 3.0, "state": "degraded"}],
                "corrections": [{"pair": ["0000:13:00.0", "0000:17:00.0"], "factor": 4.0}], "findings": []}
    text = render_links(document)
    assert "p2p gpu0 -> gpu2" in text and "degraded" in text and "4+1" in text
    assert "weight x4.0 for gpu0 <-> gpu2" in text


def test_host_memory_refuses_a_captured_tree(lying_root, capsys):
    assert main(["links", "--root", lying_root, "--backend", "host-memory"]) == 1
    assert "measures this machine, not the tree" in capsys.readouterr().err


@pytest.mark.parametrize("backend, words", [
    ("bogus", "expected host-memory, cuda or simulated:<file>"),
    ("simulated:/nonexistent/table.json", "cannot read"),
])
def test_bad_backend_gets_a_clear_error(lying_root, capsys, backend, words):
    assert main(["links", "--root", lying_root, "--json", "--backend", backend]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]  # --json: stderr is JSON lines
    assert lines[0]["root"] == lying_root and lines[0]["daemon"] is False
    error = lines[-1]
    assert error["code"] == "invalid_config" and words in error["message"]


def test_rounds_must_be_positive(lying_root, capsys):
    with pytest.raises(SystemExit):
        main(["links", "--root", lying_root, "--rounds", "0"])
    assert "expected a positive integer" in capsys.readouterr().err
