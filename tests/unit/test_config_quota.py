"""[alloc] max_gpus_per_uid and max_gpus_per_group in the one schema: checked at load, so
--check-config, start and reload agree."""

from __future__ import annotations

import grp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topod.alloc.quota import GroupCap
from topod.config import defaults, parse_config
from topod.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
OWN_GROUP = grp.getgrgid(os.getgid()).gr_name


def test_caps_default_to_unlimited():
    assert defaults().get("alloc", "max_gpus_per_uid") == "unlimited"
    assert defaults().get("alloc", "max_gpus_per_group") == ()


def test_a_group_cap_is_resolved_at_load_to_its_gid_and_listed_members():
    config = parse_config(f'[alloc]\nmax_gpus_per_uid = 4\nmax_gpus_per_group = {{ "{OWN_GROUP}" = 2 }}\n')
    assert config.get("alloc", "max_gpus_per_uid") == 4
    (cap,) = config.get("alloc", "max_gpus_per_group")
    assert isinstance(cap, GroupCap) and (cap.name, cap.gid, cap.cap) == (OWN_GROUP, os.getgid(), 2)
    table = parse_config(f'[alloc.max_gpus_per_group]\n"{OWN_GROUP}" = 0\n').get("alloc", "max_gpus_per_group")
    assert [c.cap for c in table] == [0], "a cap of 0: the group's members may hold none"


@pytest.mark.parametrize(("text", "message"), [
    ("max_gpus_per_uid = 0", "alloc.max_gpus_per_uid: expected \"unlimited\" or a whole number of GPUs >= 1"),
    ("max_gpus_per_uid = -3", "alloc.max_gpus_per_uid"),
    ("max_gpus_per_uid = 'lots'", "got 'lots'"),
    ("max_gpus_per_uid = true", "got True"),
    ("max_gpus_per_group = 3", "alloc.max_gpus_per_group: expected a table of group name = GPUs"),
    ("max_gpus_per_group = { topod-no-such-group = 2 }", "no group 'topod-no-such-group' on this host"),
    (f"max_gpus_per_group = {{ {OWN_GROUP} = -1 }}", f"alloc.max_gpus_per_group.{OWN_GROUP}: expected a whole"),
    (f"max_gpus_per_group = {{ {OWN_GROUP} = 1.5 }}", "expected a whole number of GPUs >= 0"),
    ("max_gpus_per_groups = {}", "alloc.max_gpus_per_groups: unknown key"),
])
def test_a_bad_cap_is_a_config_error_naming_the_key(text, message):
    with pytest.raises(ConfigError) as error:
        parse_config(f"[alloc]\n{text}\n")
    assert message in str(error.value)


def test_check_config_refuses_a_group_that_does_not_resolve(tmp_path):
    path = tmp_path / "topod.toml"
    path.write_text('[alloc]\nmax_gpus_per_group = { "topod-no-such-group" = 2 }\n')
    run = subprocess.run([sys.executable, "-m", "topod.service.main", "--check-config", str(path)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert run.returncode != 0
    assert "no group 'topod-no-such-group'" in run.stderr + run.stdout
    path.write_text(f'[alloc]\nmax_gpus_per_uid = 2\nmax_gpus_per_group = {{ "{OWN_GROUP}" = 2 }}\n')
    run = subprocess.run([sys.executable, "-m", "topod.service.main", "--check-config", str(path)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert run.returncode == 0, run.stderr
