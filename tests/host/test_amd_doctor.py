"""doctor on the MI300X host: which GPUs a HIP process sees (ROCr's variables first, then
HIP's or CUDA's list over what is left), and a job using GPUs outside its lease."""

from __future__ import annotations

import shutil

import pytest

from topod.discover import discover
from topod.doctor import diagnose
from topod.doctor.visible import rocm_visible
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.hostspec.doctor_scene import ProcSpec, write_process


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = build_host(load_builtin_spec("mi300x-8gpu"), tmp_path_factory.mktemp("amd-doctor") / "mi300x")
    return root, discover(HostRoot(root), live_nvml=False)


@pytest.fixture()
def mi300x(base, tmp_path):
    source, topology = base
    root = tmp_path / "mi300x"
    root.mkdir()
    shutil.copytree(source / "proc", root / "proc", ignore=shutil.ignore_patterns("irq"))
    for name in ("sys", "dev", "proc/irq"):
        (root / name).symlink_to(source / name)
    return root, topology


def test_rocr_then_hip_index_what_rocr_left(base):
    _, topology = base
    uuid5 = topology.gpu(5).uuid
    assert rocm_visible({"ROCR_VISIBLE_DEVICES": "4,5"}, topology) == (4, 5)
    assert rocm_visible({"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1"}, topology) == (5,)
    assert rocm_visible({"ROCR_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "4,5"}, topology) == ()
    assert rocm_visible({"ROCR_VISIBLE_DEVICES": f"{uuid5},0"}, topology) == (0, 5)
    assert rocm_visible({"HIP_VISIBLE_DEVICES": "2,3,x,7"}, topology) == (2, 3)  # stops at what it cannot parse
    assert rocm_visible({}, topology) is None


def test_a_job_with_hip_visible_devices_outside_its_lease_is_an_error(mi300x):
    root, topology = mi300x
    write_process(root, ProcSpec(pid=4100, name="python", cmdline=("python", "train.py"), cpus_allowed=(0, 1),
                                 threads=(0, 1), memory_mib={0: 512}, env={"HIP_VISIBLE_DEVICES": "0,4"}))
    lease = {"id": "L1", "owner": "alice", "gpus": [0, 1], "cpus": [0, 1], "pids": [4100]}
    report = diagnose(HostRoot(root), topology, pids=[4100], leases=[lease], use_nvml=False)
    (finding,) = [f for f in report.findings if f.code == "gpus_outside_lease"]
    assert finding.severity == "error" and finding.evidence["outside"] == [4]
    assert finding.evidence["environment"] == {"HIP_VISIBLE_DEVICES": "0,4"}
    assert f"ROCR_VISIBLE_DEVICES={topology.gpu(0).uuid},{topology.gpu(1).uuid}" in finding.fix
    assert "-u HIP_VISIBLE_DEVICES" in finding.fix


def test_a_job_inside_its_lease_is_not_flagged(mi300x):
    root, topology = mi300x
    write_process(root, ProcSpec(pid=4200, name="python", cmdline=("python", "train.py"), cpus_allowed=(0, 1),
                                 threads=(0, 1), memory_mib={0: 512},
                                 env={"ROCR_VISIBLE_DEVICES": topology.gpu(1).uuid}))
    lease = {"id": "L2", "owner": "alice", "gpus": [0, 1], "cpus": [0, 1], "pids": [4200]}
    report = diagnose(HostRoot(root), topology, pids=[4200], leases=[lease], use_nvml=False)
    assert "gpus_outside_lease" not in [f.code for f in report.findings]
    assert report.processes[0].job.gpus == (1,)
