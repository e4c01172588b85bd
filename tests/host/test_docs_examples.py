"""The documentation's examples that no other test runs: the Prometheus scrape config and
alert rules are checked by promtool, every configuration snippet by topod's own loader,
the metrics they name against the exporter, and the shown outputs of `allocate` (with
NICs), `export slurm-gres` and `doctor` against what topoctl prints on the same hosts.
(The Slurm topology.conf examples: test_slurm_docs_example.py; the curl examples:
tests/service/test_daemon_api.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from topod.config import parse_config

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXPORTS = (REPO / "docs" / "exports.md").read_text()
OPERATIONS = (REPO / "docs" / "operations.md").read_text()
DEMO_ROOT = "/tmp/h800-demo"  # the directory the pages' examples write the demo host to


def _yaml_block(text: str, first_key: str) -> str:
    block = re.search(rf"```yaml\n({first_key}:.*?)```", text, re.S)
    assert block, f"docs/exports.md shows a YAML block starting with {first_key}:"
    return block.group(1)


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: make test installs Debian's prometheus package")
    return promtool


def _console_example(text: str, command: str) -> list[str]:
    """The lines shown under `$ COMMAND` in a console block, up to the next prompt."""
    block = re.search(rf"^\$ {re.escape(command)}\n(.*?)^(?:\$ |```)", text, re.S | re.M)
    assert block, f"the docs show `$ {command}` with its output"
    return block.group(1).splitlines()


def test_the_scrape_config_is_valid_for_prometheus(tmp_path):
    (tmp_path / "prometheus.yml").write_text(_yaml_block(EXPORTS, "scrape_configs"))
    result = subprocess.run([_promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_rules_are_valid_for_prometheus(tmp_path):
    rules = _yaml_block(EXPORTS, "groups")
    (tmp_path / "rules.yml").write_text(rules)
    result = subprocess.run([_promtool(), "check", "rules", str(tmp_path / "rules.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(re.findall(r"^\s+- alert: ", rules, re.M)) >= 3


def _exported_metric_names() -> set[str]:
    """Every name topod's exposition can carry: the families' names with the suffixes the
    text format adds to counters, histograms and info metrics."""
    source = (REPO / "topod" / "export" / "metrics.py").read_text()
    families = re.findall(r'PREFIX \+ "(\w+)"', source)
    assert families, "topod/export/metrics.py names its families as PREFIX + \"name\""
    return {f"topod_{name}{suffix}" for name in families
            for suffix in ("", "_total", "_bucket", "_sum", "_count", "_info")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_metric_the_docs_name_is_one_topod_exports(page):
    named = set(re.findall(r"\btopod_[a-z_]+[a-z]\b", page.read_text()))
    unknown = sorted(named - _exported_metric_names())
    assert not unknown, f"{page.name} names metrics topod does not export: {unknown}"


def _config_snippets() -> list[str]:
    found: set[str] = set()
    for page in PAGES:
        found.update(re.findall(r"`(\[\w+\] [a-z_]+ = [^`]+)`", page.read_text()))
    return sorted(found)


def test_the_docs_show_config_snippets():
    assert len(_config_snippets()) >= 5


@pytest.mark.parametrize("snippet", _config_snippets())
def test_every_config_snippet_in_the_docs_is_accepted(snippet):
    section, assignment = snippet.split("] ", 1)
    parse_config(f"{section}]\n{assignment}\n")


def _toml_blocks() -> list[str]:
    return [block for page in PAGES for block in re.findall(r"^```toml\n(.*?)^```", page.read_text(), re.S | re.M)]


def test_the_docs_show_a_configuration_block():
    assert any("max_gpus_per_group" in block for block in _toml_blocks())


@pytest.mark.parametrize("block", _toml_blocks())
def test_every_configuration_block_in_the_docs_is_accepted(block, monkeypatch):
    """Whole TOML blocks, by topod's own loader; the groups they name (physics, students)
    stand in for the host's, which the loader otherwise requires to exist."""
    import grp

    def any_group(name: str) -> grp.struct_group:
        return grp.struct_group((name, "x", 60000 + len(name), []))

    monkeypatch.setattr(grp, "getgrnam", any_group)
    config = parse_config(block)
    caps = config.get("alloc", "max_gpus_per_group")
    assert all(cap.name in block and str(cap.cap) in block for cap in caps)


def test_the_documented_default_configuration_is_accepted():
    parse_config((REPO / "etc" / "topod.toml").read_text())


def test_the_nic_example_is_what_allocate_prints_on_the_demo_host(readonly_host, capsys):
    from topod.alloc.engine import allocate
    from topod.alloc.nics import nic_environment
    from topod.alloc.request import FreeState, Request
    from topod.cli.lease_cmd import _print_lease
    from topod.distance import DistanceModel

    _, topology = readonly_host("h800-8gpu")
    decision = allocate(topology, DistanceModel(topology), FreeState(), Request(gpus=2, cpus_per_gpu=2))
    _print_lease({"id": "x", "gpus": list(decision.gpus), "decision": {},
                  "placements": [p.to_json() for p in decision.placements]})
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  GPU")]
    block = re.search(r"\$ topoctl allocate --gpus 2 --cpus-per-gpu 2 --job mn-train\n(.*?)```", EXPORTS, re.S)
    assert block, "docs/exports.md shows the allocate output with NICs"
    shown = [line for line in block.group(1).splitlines() if line.startswith("  GPU")]
    assert shown == printed and all("(PIX)" in line for line in shown)
    env = nic_environment(decision.placements)
    for name, value in env.items():
        assert f"{name}={value}" in block.group(1)  # the allocate line
        assert re.search(rf"^{name}={re.escape(value)} ", EXPORTS, re.M)  # the multi-node job block


@pytest.fixture(scope="module")
def doctor_scene(tmp_path_factory):
    """The demo host with its 8-rank job, written by the pages' first command
    (`topoctl example-host h800-8gpu DIR --demo-job`), with what it prints checked too."""
    import contextlib
    import io

    from topod.cli.topoctl import main

    root = tmp_path_factory.mktemp("h800-demo") / "h800-demo"
    command = f"topoctl example-host h800-8gpu {DEMO_ROOT} --demo-job"
    shown = _console_example(OPERATIONS, command + "   # 8 ranks, rank 3 on the far socket")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(command.replace(DEMO_ROOT, str(root)).split()[1:]) == 0
    assert shown == out.getvalue().replace(str(root), DEMO_ROOT).splitlines()
    return root


def _topoctl(argv: list[str], root: Path, capsys) -> tuple[int, list[str]]:
    """Run topoctl with no daemon; its stderr then stdout, with the pages' paths."""
    from topod.cli.topoctl import main

    socket = root.parent / "no-daemon.sock"
    status = main(["--socket", str(socket), *argv])
    captured = capsys.readouterr()
    text = (captured.err + captured.out).replace(str(root), DEMO_ROOT)
    return status, text.replace(str(socket), "/run/topod/topod.sock").splitlines()


def _shown_lines(example: list[str]) -> list[str]:
    return [line for line in example if line != "…"]


def test_the_slurm_gres_example_is_what_topoctl_writes(doctor_scene, capsys):
    shown = _console_example(EXPORTS, f"topoctl export slurm-gres --root {DEMO_ROOT}")
    status, printed = _topoctl(["export", "slurm-gres", "--root", str(doctor_scene)], doctor_scene, capsys)
    assert status == 0
    assert printed[1:] == shown  # printed[0]: the root, on stderr (the page shows stdout)
    assert printed[0].startswith(f"topoctl: root {DEMO_ROOT}; ")


def test_the_amd_example_is_what_topoctl_writes(tmp_path, capsys):
    """docs/exports.md's MI300X session, run as shown: the example host, then its gres.conf
    with render nodes and xGMI links."""
    from topod.cli.topoctl import main

    shown_root, root = "/tmp/mi300x", tmp_path / "mi300x"
    for command in (f"topoctl example-host mi300x-8gpu {shown_root}", f"topoctl export slurm-gres --root {shown_root}"):
        shown = _console_example(EXPORTS, command)
        status = main(["--socket", str(tmp_path / "no-daemon.sock"), *command.replace(shown_root, str(root)).split()[1:]])
        assert status == 0
        assert capsys.readouterr().out.replace(str(root), shown_root).splitlines() == shown
    assert "File=/dev/dri/renderD128" in shown[4] and "Links=-1,1,1,1,1,1,1,1" in shown[4]


def test_the_doctor_example_is_what_doctor_prints(doctor_scene, capsys):
    shown = _console_example(OPERATIONS, f"topoctl doctor --root {DEMO_ROOT}")
    status, printed = _topoctl(["doctor", "--root", str(doctor_scene)], doctor_scene, capsys)
    assert status == 3, "findings"
    lines = _shown_lines(shown)
    assert len(lines) >= 10
    position = 0
    for line in lines:  # in order; `…` stands for lines left out
        assert line in printed[position:], f"doctor does not print (here): {line}"
        position = printed.index(line, position) + 1
    assert shown[:4] == printed[:4], "the page shows the first lines whole"


def test_the_topology_document_table_lists_every_key_topod_writes(readonly_host):
    from topod.topojson import topology_to_json

    host, topology = readonly_host("h800-8gpu")
    document = topology_to_json(topology)
    page = (REPO / "docs" / "api.md").read_text()
    table = page[page.index("## The topology document"):page.index("## Errors")]
    rows = dict(re.findall(r"^\| `(\w+)(?:\[\])?` \| (.*) \|$", table, re.M))
    assert set(rows) == set(document), "the table's rows are the document's top-level keys"
    for key, cell in rows.items():
        listed = re.findall(r"`(\w+)`", cell)
        value = document[key]
        item = value[0] if isinstance(value, list) and value else value
        if listed and isinstance(item, dict):
            assert set(listed) == set(item), f"{key}: listed {sorted(listed)}, written {sorted(item)}"
