"""`topoctl bind` gives each rank its own GPU's NIC: NCCL_IB_HCA and UCX_NET_DEVICES in the
exec'd command's environment are narrowed to the NICs TOPOD_GPU_NICS lists for that GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from topod.cli.bind_cmd import BindError, rank_binding

REPO = Path(__file__).resolve().parents[2]
CPU = sorted(os.sched_getaffinity(0))[0]
# What a lease with NICs puts in the environment (topod.alloc.nics.nic_environment's forms).
LEASE_ENV = {"TOPOD_GPU_CPUS": f"3:{CPU};5:{CPU}", "TOPOD_GPU_NODES": "3:0;5:0", "TOPOD_GPUS": "3,5",
             "CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb",
             "NCCL_IB_HCA": "=mlx5_3:1,mlx5_5:1,mlx5_10:2", "UCX_NET_DEVICES": "mlx5_3:1,mlx5_5:1,mlx5_10:2",
             "TOPOD_GPU_NICS": "3:mlx5_3;5:mlx5_5,mlx5_10:2"}
PROBE = "echo hca=$NCCL_IB_HCA; echo ucx=$UCX_NET_DEVICES; echo nics=$TOPOD_GPU_NICS"


def _bind(env: dict[str, str], command: str = PROBE) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "NCCL_IB_HCA",
                         "UCX_NET_DEVICES", "TOPOD_GPU_NICS")}
    full.update(env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "bind", "--", "sh", "-c", command],
                          env=full, capture_output=True, text=True, timeout=60)


def _seen(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


@pytest.mark.parametrize(("rank", "hca", "ucx"), [
    (0, "=mlx5_3:1", "mlx5_3:1"),
    (1, "=mlx5_5:1,mlx5_10:2", "mlx5_5:1,mlx5_10:2"),
])
def test_each_rank_sends_through_its_own_gpus_nics(rank, hca, ucx):
    done = _bind({**LEASE_ENV, "LOCAL_RANK": str(rank)})
    assert done.returncode == 0, done.stderr
    seen = _seen(done.stdout)
    assert seen["hca"] == hca, "NCCL_IB_HCA narrowed to the rank's GPU's NICs, exact-match form"
    assert seen["ucx"] == ucx
    assert seen["nics"] == LEASE_ENV["TOPOD_GPU_NICS"], "the lease's per-GPU table is left for the job"


def test_a_lease_without_nics_leaves_the_variables_as_they_are():
    env = {k: v for k, v in LEASE_ENV.items() if k != "TOPOD_GPU_NICS"}
    env.update(NCCL_IB_HCA="=mlx5_9:1", UCX_NET_DEVICES="mlx5_9:1", LOCAL_RANK="1")
    done = _bind(env)
    assert done.returncode == 0, done.stderr
    assert _seen(done.stdout) == {"hca": "=mlx5_9:1", "ucx": "mlx5_9:1", "nics": ""}
    assert "NIC" not in done.stderr


def test_a_gpu_the_lease_gave_no_nic_keeps_the_leases_nics_and_says_so():
    done = _bind({**LEASE_ENV, "TOPOD_GPU_NICS": "3:mlx5_3;5:", "LOCAL_RANK": "1"})
    assert done.returncode == 0, done.stderr
    seen = _seen(done.stdout)
    assert seen["hca"] == LEASE_ENV["NCCL_IB_HCA"] and seen["ucx"] == LEASE_ENV["UCX_NET_DEVICES"]
    assert "GPU 5 has no NIC of its own in the lease" in done.stderr


@pytest.mark.parametrize(("text", "complaint"), [
    ("3mlx5_3", "expected GPU:VALUE pairs"),
    ("3:mlx5_3:x", "'mlx5_3:x' is not a NIC"),
    ("3:,mlx5_3", "'' is not a NIC"),
])
def test_a_malformed_nic_table_is_exit_2_and_the_command_never_runs(tmp_path, text, complaint):
    marker = tmp_path / "ran"
    done = _bind({**LEASE_ENV, "TOPOD_GPU_NICS": text, "LOCAL_RANK": "0"}, command=f"touch {marker}")
    assert done.returncode == 2 and complaint in done.stderr
    assert not marker.exists()
    with pytest.raises(BindError, match="TOPOD_GPU_NICS"):
        rank_binding({**LEASE_ENV, "TOPOD_GPU_NICS": text, "LOCAL_RANK": "0"})


def test_the_binding_matches_the_python_client():
    """topoctl bind and topod.client.bind_local_rank narrow the same way (one implementation)."""
    from topod.alloc.nics import rank_nic_environment

    binding = rank_binding({**LEASE_ENV, "LOCAL_RANK": "1"})
    assert binding.nic_environment == rank_nic_environment(LEASE_ENV["TOPOD_GPU_NICS"], "5")
    assert binding.nic_environment == {"NCCL_IB_HCA": "=mlx5_5:1,mlx5_10:2", "UCX_NET_DEVICES": "mlx5_5:1,mlx5_10:2"}
