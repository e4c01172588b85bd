"""docs/exports.md's Slurm topology examples, run: three GB200 trays built from the gb200
host spec (two registered, one still registering), their `topo --json` documents exported
by topoctl, every line compared with the page; the tree form is also loaded by slurmctld."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from topod.cli.topoctl import main
from topod.discover import discover
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.topojson import topology_to_json

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "exports.md").read_text()
STATES = ("completed", "completed", "in-progress")
LABELS = ({"rack": "r01", "leaf": "l1"}, {"rack": "r01", "leaf": "l1"}, {"rack": "r01"})


@pytest.fixture(scope="module")
def trays(tmp_path_factory):
    """The three trays' `topoctl topo --json` documents, as the page's files."""
    directory = tmp_path_factory.mktemp("trays")
    for number, state in enumerate(STATES):
        spec = copy.deepcopy(load_builtin_spec("gb200-nvl72-tray0"))
        spec["name"], spec["hostname"] = f"gb200-nvl72-tray{number}", f"nvl72-r01-t{number}"
        spec["nvml"]["nvlink_domain"]["state"] = state
        root = build_host(spec, directory / f"root{number}")
        document = topology_to_json(discover(HostRoot(root), live_nvml=False))
        (directory / f"nvl72-r01-t{number}.json").write_text(json.dumps(document))
    return directory


def _example(command_start: str) -> tuple[list[str], list[str]]:
    """(argv after `topoctl`, the lines shown under it) of the page's console block whose
    command starts so."""
    for block in re.findall(r"```console\n(.*?)```", PAGE, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(f"$ topoctl {command_start}"):
                return line[len("$ topoctl "):].split(), lines[i + 1:]
    raise AssertionError(f"docs/exports.md shows no `topoctl {command_start}` example")


def _run(argv, directory, capsys, monkeypatch) -> list[str]:
    monkeypatch.chdir(directory)
    assert main(argv) == 0
    captured = capsys.readouterr()
    return captured.err.splitlines() + captured.out.splitlines()


def test_the_block_example_is_what_topoctl_writes(trays, capsys, monkeypatch):
    argv, shown = _example("export slurm-topology nvl72")
    assert _run(argv, trays, capsys, monkeypatch) == shown
    assert "BlockSizes=2" in shown and any("nvl72-r01-t2: fabric registration in-progress" in s for s in shown)


def test_the_tree_example_is_what_topoctl_writes_and_slurmctld_loads(trays, tmp_path, capsys, monkeypatch):
    labelled = tmp_path / "labelled"
    labelled.mkdir()
    for number, labels in enumerate(LABELS):  # as GET /v1/topology adds them from [cluster]
        document = json.loads((trays / f"nvl72-r01-t{number}.json").read_text())
        (labelled / f"nvl72-r01-t{number}.json").write_text(json.dumps(dict(document, cluster=labels)))
    argv, shown = _example("export slurm-topology --mode tree")
    assert _run(argv, labelled, capsys, monkeypatch) == shown
    from test_slurm_slurmctld import SCONTROL, SLURMCTLD, assert_slurmctld_loads

    if SLURMCTLD is None or SCONTROL is None:
        pytest.skip("slurmctld/scontrol not installed (Debian packages slurmctld, slurm-client)")
    ctld_dir = tmp_path / "ctld"
    ctld_dir.mkdir()
    assert_slurmctld_loads(ctld_dir, "\n".join(shown) + "\n", [f"nvl72-r01-t{n}" for n in range(3)])
