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
