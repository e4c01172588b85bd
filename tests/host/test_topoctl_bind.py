"""`topoctl bind`: each rank pinned to its own GPU's cores, for real on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topod.cli.bind_cmd import BindError, rank_binding

REPO = Path(__file__).resolve().parents[2]
CPUS = sorted(os.sched_getaffinity(0))
LEASE_ENV = {"TOPOD_GPU_CPUS": f"3:{CPUS[0]};5:{CPUS[-1]}", "TOPOD_GPU_NODES": "3:0;5:0",
             "CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb", "TOPOD_GPUS": "3,5"}
PROBE = ("grep Cpus_allowed_list /proc/self/status; grep -m1 -o 'bind:[0-9,-]*' /proc/self/numa_maps || true; "
         "echo visible=$CUDA_VISIBLE_DEVICES rank_cpus=$TOPOD_RANK_CPUS")


def _bind(env: dict[str, str], *args: str, command: str = PROBE) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                                             "SLURM_LOCALID")}
    full.update(env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "bind", *args, "--", "sh", "-c", command],
                          env=full, capture_output=True, text=True, timeout=60)


def _allowed(stdout: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in stdout.splitlines() if line.startswith("Cpus_allowed_list"))


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
@pytest.mark.parametrize(("variable", "rank"), [("LOCAL_RANK", 0), ("LOCAL_RANK", 1),
                                                 ("OMPI_COMM_WORLD_LOCAL_RANK", 1), ("SLURM_LOCALID", 0)])
def test_each_rank_runs_on_its_own_gpus_cores_only(variable, rank):
    done = _bind({**LEASE_ENV, variable: str(rank)})
    assert done.returncode == 0, done.stderr
    want = CPUS[0] if rank == 0 else CPUS[-1]
    assert _allowed(done.stdout) == str(want), "the exec'd command's affinity is the rank's GPU's cores"
    assert "visible=GPU-aaa,GPU-bbb" in done.stdout, "CUDA_VISIBLE_DEVICES is left as the lease set it"
    assert f"rank_cpus={want}" in done.stdout
    if Path("/proc/self/numa_maps").exists() and "memory not bound" not in done.stderr:
        assert "bind:0" in done.stdout, "memory bound to the GPU's node (MPOL_BIND)"


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
def test_rank_out_of_range_is_exit_2_and_the_command_never_runs(tmp_path):
    marker = tmp_path / "ran"
    done = _bind({**LEASE_ENV, "LOCAL_RANK": "2"}, command=f"touch {marker}")
    assert done.returncode == 2
    assert "rank 2 (LOCAL_RANK) is out of range: the lease has 2 GPU(s)" in done.stderr
    assert not marker.exists()


def test_gpu_without_cores_in_the_lease_is_exit_2_not_a_fallback(tmp_path):
    marker = tmp_path / "ran"
    done = _bind({**LEASE_ENV, "TOPOD_GPU_CPUS": f"3:;5:{CPUS[0]}", "LOCAL_RANK": "0"}, command=f"touch {marker}")
    assert done.returncode == 2
    assert "GPU 3 has no cores in the lease" in done.stderr
    assert not marker.exists()


def test_cpus_this_host_lacks_are_exit_2(tmp_path):
    marker = tmp_path / "ran"
    done = _bind({**LEASE_ENV, "TOPOD_GPU_CPUS": "3:4000-4001", "LOCAL_RANK": "0"}, command=f"touch {marker}")
    assert done.returncode == 2
    assert "cannot pin to GPU 3's CPUs 4000-4001" in done.stderr
    assert not marker.exists()


def test_cpus_this_host_lacks_beside_ones_it_has_run_on_those_with_a_warning_naming_the_rest():
    done = _bind({**LEASE_ENV, "TOPOD_GPU_CPUS": f"3:{CPUS[0]},4000-4001", "LOCAL_RANK": "0"})
    assert done.returncode == 0, done.stderr
    assert _allowed(done.stdout) == str(CPUS[0])
    assert (f"rank 0: WARNING: pinned to CPUs {CPUS[0]} only: the lease's CPUs 4000-4001 are not available"
            in done.stderr)


def test_no_rank_and_no_lease_are_usage_errors():
    assert "no local rank" in _bind(LEASE_ENV).stderr
    done = _bind({"LOCAL_RANK": "0"})
    assert done.returncode == 2 and "TOPOD_GPU_CPUS is not set" in done.stderr


def test_rank_variables_in_order_and_rank_option_wins():
    env = {**LEASE_ENV, "OMPI_COMM_WORLD_LOCAL_RANK": "1", "SLURM_LOCALID": "0"}
    assert rank_binding(env).rank_source == "OMPI_COMM_WORLD_LOCAL_RANK"
    assert rank_binding({**env, "LOCAL_RANK": "0"}).gpu == 3
    assert rank_binding(env, rank=0).rank_source == "--rank"
    with pytest.raises(BindError, match="is not a rank number"):
        rank_binding({**LEASE_ENV, "LOCAL_RANK": "x"})


def test_gpu_memory_node_joins_only_when_asked():
    env = {**LEASE_ENV, "TOPOD_GPU_MEMORY_NODES": "3:8;5:9", "LOCAL_RANK": "1"}
    assert rank_binding(env).memory_nodes == (0,)
    assert rank_binding(env, gpu_memory=True).memory_nodes == (0, 9)
    assert rank_binding(env).visible_device == "GPU-bbb"
    assert rank_binding({**env, "TOPOD_GPU_NODES": "3:;5:"}).memory_nodes == ()


def test_bind_local_rank_reports_the_cpus_the_kernel_kept_and_what_is_missing():
    """The Python client's binding says the same as `topoctl bind` (run in a child: it
    pins the calling process)."""
    script = ("import json, sys; from topod.client import bind_local_rank; "
              "env = {'TOPOD_GPU_CPUS': sys.argv[1], 'TOPOD_GPU_NODES': '3:0'}; "
              "print(json.dumps(bind_local_rank(0, env)))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = lambda cpus: json.loads(subprocess.run(  # noqa: E731
        [sys.executable, "-c", script, cpus], env=env, capture_output=True, text=True, timeout=60, check=True).stdout)
    partial = run(f"3:{CPUS[0]},4000-4001")
    assert partial["cpus"] == [CPUS[0], 4000, 4001] and partial["pinned_cpus"] == [CPUS[0]]
    assert partial["pinning_warning"].startswith(f"pinned to CPUs {CPUS[0]} only: the lease's CPUs 4000-4001 ")
    whole = run(f"3:{CPUS[0]}")
    assert whole["pinned_cpus"] == [CPUS[0]] and whole["pinning_warning"] is None
