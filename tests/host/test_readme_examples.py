"""README examples that no other test runs: the Prometheus scrape config and the
configuration snippets it shows are checked by the real tools."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from topod.config import parse_config

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_scrape_config_is_valid_for_prometheus(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: make test installs Debian's prometheus package")
    block = re.search(r"```yaml\n(scrape_configs:.*?)```", README, re.S)
    assert block, "README shows a scrape config"
    (tmp_path / "prometheus.yml").write_text(block.group(1))
    result = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("snippet", sorted(set(re.findall(r"`(\[\w+\] [a-z_]+ = [^`]+)`", README))))
def test_every_config_snippet_in_the_readme_is_accepted(snippet):
    section, assignment = snippet.split("] ", 1)
    parse_config(f"{section}]\n{assignment}\n")


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
    block = re.search(r"\$ topoctl allocate --gpus 2 --cpus-per-gpu 2 --job mn-train\n(.*?)```", README, re.S)
    assert block, "README shows the allocate output with NICs"
    shown = [line for line in block.group(1).splitlines() if line.startswith("  GPU")]
    assert shown == printed and all("(PIX)" in line for line in shown)
    env = nic_environment(decision.placements)
    for name, value in env.items():
        assert f"{name}={value}" in block.group(1)  # the allocate line
        assert re.search(rf"^{name}={re.escape(value)} ", README, re.M)  # the multi-node job block
