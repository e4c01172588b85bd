"""`topoctl example-host NAME DIR` writes a built-in host tree that topod and every
host-side command read as they read a real host; it writes only into a new or empty
directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from topod.hostspec import builtin_spec_names

REPO = Path(__file__).resolve().parents[2]


def topoctl(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), TOPOD_SOCKET="/nonexistent/topod.sock")
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_list_names_every_built_in_host():
    listed = topoctl("example-host", "--list")
    assert listed.returncode == 0, listed
    assert listed.stdout.split() == builtin_spec_names() and "h800-8gpu" in listed.stdout
    assert json.loads(topoctl("example-host", "--list", "--json").stdout) == builtin_spec_names()


def test_an_example_host_is_a_root_topoctl_and_topod_read(tmp_path, daemon_factory):
    root = tmp_path / "h800"
    made = topoctl("example-host", "h800-8gpu", str(root))
    assert made.returncode == 0, made
    assert "wrote h800-8gpu" in made.stdout and "8 GPU(s)" in made.stdout
    topo = topoctl("topo", "--root", str(root), "--json")
    assert topo.returncode == 0, topo
    assert len(json.loads(topo.stdout)["gpus"]) == 8
    client = daemon_factory(root=root).start()
    assert client.health()["gpus"] == 8
    assert len(client.allocate(2, ttl_seconds=60)["gpus"]) == 2


def test_demo_job_gives_doctor_a_rank_on_the_far_socket(tmp_path):
    root = tmp_path / "demo"
    assert topoctl("example-host", "h800-8gpu", str(root), "--demo-job").returncode == 0
    doctor = topoctl("doctor", "--root", str(root))
    assert doctor.returncode == 3, doctor
    assert "gpu_remote_cpu: pid 4130" in doctor.stdout


def test_a_directory_in_use_is_never_written_into(tmp_path):
    used = tmp_path / "home"
    used.mkdir()
    (used / "notes.txt").write_text("mine\n")
    refused = topoctl("example-host", "h800-8gpu", str(used))
    assert refused.returncode == 2 and "not empty" in refused.stderr, refused
    assert sorted(os.listdir(used)) == ["notes.txt"]
    file = tmp_path / "file"
    file.write_text("x")
    assert topoctl("example-host", "h800-8gpu", str(file)).returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert topoctl("example-host", "vm-nogpu", str(empty)).returncode == 0 and (empty / "sys").is_dir()


def test_an_unknown_name_or_missing_dir_is_a_usage_error_that_lists_the_hosts(tmp_path):
    unknown = topoctl("example-host", "a100-box", str(tmp_path / "x"))
    assert unknown.returncode == 2 and "h800-8gpu" in unknown.stderr and "a100-box" in unknown.stderr
    assert not (tmp_path / "x").exists()
    assert topoctl("example-host", "h800-8gpu").returncode == 2
    small = topoctl("example-host", "vm-nogpu", str(tmp_path / "y"), "--demo-job")
    assert small.returncode == 2 and "--demo-job" in small.stderr
