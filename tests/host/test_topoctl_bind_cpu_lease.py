"""`topoctl bind` inside a lease without GPUs: every rank is pinned to the lease's CPUs and
bound to its memory nodes, no rank variable needed; CUDA_VISIBLE_DEVICES stays empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from topod.cli.bind_cmd import BindError, rank_binding

REPO = Path(__file__).resolve().parents[2]
CPUS = sorted(os.sched_getaffinity(0))
CPU_LEASE_ENV = {"CUDA_VISIBLE_DEVICES": "", "TOPOD_GPUS": "", "TOPOD_CPUS": str(CPUS[-1]),
                 "TOPOD_MEMORY_NODES": "0", "TOPOD_LEASE": "abc"}


def test_a_cpu_lease_binds_every_rank_to_the_whole_lease():
    for rank in (None, 0, 3):
        binding = rank_binding(dict(CPU_LEASE_ENV, TOPOD_CPUS="4-7", TOPOD_MEMORY_NODES="1"), rank)
        assert binding.gpu is None and binding.cpus == (4, 5, 6, 7) and binding.memory_nodes == (1,)
        assert binding.rank == (rank or 0) and binding.visible_device == ""


def test_a_cpu_lease_with_a_bad_cpu_list_is_a_bind_error():
    with pytest.raises(BindError, match="TOPOD_CPUS"):
        rank_binding(dict(CPU_LEASE_ENV, TOPOD_CPUS="4-x"))
    with pytest.raises(BindError, match="TOPOD_MEMORY_NODES"):
        rank_binding(dict(CPU_LEASE_ENV, TOPOD_MEMORY_NODES="one"))


def test_outside_any_lease_bind_still_says_so():
    with pytest.raises(BindError, match="TOPOD_GPU_CPUS is not set"):
        rank_binding({"LOCAL_RANK": "0"})


def test_bind_in_a_cpu_lease_runs_the_command_on_the_lease_cpus_only():
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                                            "SLURM_LOCALID")}
    env.update(CPU_LEASE_ENV, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "bind", "--", "sh", "-c",
                           "grep Cpus_allowed_list /proc/self/status; echo visible=[$CUDA_VISIBLE_DEVICES] "
                           "rank_gpu=[${TOPOD_RANK_GPU-unset}]"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    allowed = next(line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
                   if line.startswith("Cpus_allowed_list"))
    assert allowed == str(CPUS[-1])
    assert "visible=[]" in done.stdout and "rank_gpu=[unset]" in done.stdout
