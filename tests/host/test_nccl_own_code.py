"""topod's NCCL topology files through NCCL's own code: its XML parser
(ncclTopoGetXmlFromFile) and, after replaying per rank what ncclTopoGetSystem does on one
node (fill from the machine, trim, fuse: tests/nccl/main.cc), its system builder
(ncclTopoGetSystemFromXml). tests/nccl/build.sh compiles those NCCL sources unmodified
from a checkout: set TOPOD_NCCL_SRC to one (TOPOD_CUDA_HOME to a CUDA toolkit where it
is not /usr/local/cuda; g++ needed). Skipped otherwise. Checked with NCCL v2.30.7."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from topod.discover import discover
from topod.export.nccl_host import host_nccl_xml
from topod.host import HostRoot
from topod.hostspec import builtin_spec_names, load_builtin_spec

NCCL_SRC = os.environ.get("TOPOD_NCCL_SRC")
CUDA_HOME = Path(os.environ.get("TOPOD_CUDA_HOME", "/usr/local/cuda"))
HARNESS = Path(__file__).resolve().parents[1] / "nccl"
pytestmark = pytest.mark.skipif(
    not NCCL_SRC or not (CUDA_HOME / "include/cuda.h").is_file() or shutil.which("g++") is None,
    reason="NCCL's own topology code: set TOPOD_NCCL_SRC to an NCCL checkout (CUDA headers and g++ needed)")
GPU_HOSTS = [name for name in builtin_spec_names() if "'gpu'" in repr(load_builtin_spec(name).get("root_complex"))]


@pytest.fixture(scope="module")
def nccl(tmp_path_factory):
    binary = tmp_path_factory.mktemp("nccl") / "nccl-topo"
    subprocess.run([str(HARNESS / "build.sh"), NCCL_SRC, str(binary), str(CUDA_HOME)], check=True,
                   capture_output=True, timeout=600)
    return binary


def _load(nccl: Path, text: str, where: Path) -> subprocess.CompletedProcess:
    where.write_text(text)
    return subprocess.run([str(nccl), str(where), "--emulate"], capture_output=True, text=True, timeout=120)


def _count(output: str, kind: str) -> int:
    found = re.search(rf"^{kind}: (\d+)$", output, re.M)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("name", GPU_HOSTS)
def test_nccl_builds_its_topology_from_each_hosts_file_and_a_leases(nccl, readonly_host, name, tmp_path):
    host, topology = readonly_host(name)
    whole = host_nccl_xml(host, topology)
    assert whole.warnings == ()
    run = _load(nccl, whole.text, tmp_path / "host.xml")
    assert run.returncode == 0 and "RESULT: SYSTEM BUILD OK" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    assert _count(run.stdout, "GPU") == len(topology.gpus)
    if f'arch="{platform.machine()}"' in whole.text:
        # One <cpu> per node, each rank's copy merged: NCCL fills the CPU above a rank's GPU
        # from the machine it runs on (on x86 also vendor, family, model), so an arm64
        # file replayed here keeps a filled and an unfilled copy, which a Grace would not.
        assert _count(run.stdout, "CPU") == len({gpu.numa_node for gpu in topology.gpus} | {
            d.numa_node for d in topology.devices_of_kind("rdma", "nic")})
    # a lease's file: two GPUs from different NUMA nodes where the host has them
    first = topology.gpus[0]
    second = next((g for g in topology.gpus if g.numa_node != first.numa_node), topology.gpus[-1])
    lease = host_nccl_xml(host, topology, gpus=[first.index, second.index])
    run = _load(nccl, lease.text, tmp_path / "lease.xml")
    assert run.returncode == 0 and _count(run.stdout, "GPU") == len({first.index, second.index}), run.stderr[-2000:]


def test_without_the_cpus_identity_nccl_fails_as_topods_warning_says(nccl, host_tree, tmp_path):
    tree = host_tree("h800-8gpu")
    (tree / "proc/cpuinfo").write_text("processor\t: 0\n\n")
    host = HostRoot(tree)
    written = host_nccl_xml(host, discover(host, live_nvml=False))
    assert [w.code for w in written.warnings] == ["nccl_cpu_identity_unknown"]
    run = _load(nccl, written.text, tmp_path / "host.xml")
    assert run.returncode == 1 and "Attribute arch of node cpu not found" in run.stderr
