"""Block topology files loaded by a real slurmctld with topology/block (Slurm >= 24.05,
built from SchedMD's source; Debian 12 has only 22.05, which lacks the plugin). Manual:
set TOPOD_SLURM_PREFIX to the install prefix (docs/exports.md, "topology.conf"); skipped
otherwise. Each file: slurmctld starts, `scontrol show topology` lists the blocks topoctl
wrote, and a multi-node job on power-saving CLOUD nodes (`sbatch --test-only`) is placed
inside one NVLink domain whenever one can hold it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from test_slurm_slurmctld import Slurmctld
from topod.export.slurm_topology import build_topology_conf, host_entry

PREFIX = Path(os.environ.get("TOPOD_SLURM_PREFIX", "/nonexistent"))
SLURMCTLD, SCONTROL, SBATCH = PREFIX / "sbin/slurmctld", PREFIX / "bin/scontrol", PREFIX / "bin/sbatch"
pytestmark = pytest.mark.skipif(not SLURMCTLD.exists(), reason="no from-source Slurm >= 24.05 (set "
                                "TOPOD_SLURM_PREFIX; docs/exports.md says how)")
UUID = "5a1b0c2d-0000-4e3f-9a7b-72a000000001"
# Power saving: CLOUD nodes count as available and are 'resumed' by /bin/true.
CLOUD = (f"PluginDir={PREFIX}/lib/slurm\nSuspendProgram=/bin/true\nResumeProgram=/bin/true\nSuspendTime=600\n"
         "ResumeTimeout=600\nSchedulerType=sched/builtin\n")


def trays(prefix, count, clique, state="completed"):
    return [host_entry({"hostname": f"{prefix}{i}", "nvlink_domain": {"cluster_uuid": UUID, "clique_ids": [clique],
                                                                      "state": state}}) for i in range(count)]


def _domain_of(name: str) -> str:
    return name.rstrip("0123456789")


def start(tmp_path: Path, text: str, nodes: list[str]) -> tuple[Slurmctld, str]:
    ctld = Slurmctld(tmp_path, text, nodes, plugin="block", slurmctld=str(SLURMCTLD), scontrol=str(SCONTROL),
                     extra=CLOUD, node_state="State=CLOUD")
    return ctld, ctld.show_topology()


def placed(ctld: Slurmctld, nodes: int) -> set[str]:
    result = ctld.run("--test-only", "-N", str(nodes), "--wrap", "true", program=str(SBATCH), timeout=10)
    match = re.search(r"on nodes (\S+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr + ctld.log.read_text()
    return ctld.expand(match.group(1))


CASES = {
    "4-4-2": trays("nvl-a", 4, 1) + trays("nvl-b", 4, 2) + trays("nvl-c", 2, 3),
    "registering-tray": trays("nvl-a", 2, 1) + trays("nvl-b", 1, 1, state="in-progress") + trays("nvl-c", 2, 2),
    "larger-domain": trays("nvl-a", 2, 1) + trays("nvl-b", 2, 2) + trays("nvl-c", 4, 3),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_slurmctld_loads_each_block_file_and_keeps_jobs_in_one_domain(tmp_path, case):
    hosts = CASES[case]
    result = build_topology_conf(hosts)
    ctld, shown = start(tmp_path, result.text, [h.name for h in hosts])
    try:
        blocks = {}
        for line in shown.splitlines():
            fields = dict(part.split("=", 1) for part in line.split())
            if "BlockName" in fields and "," not in fields["BlockName"]:  # aggregated blocks list several
                blocks[fields["BlockName"]] = ctld.expand(fields["Nodes"])
        ours = {line.split()[0][len("BlockName="):]: set(line.split()[1][len("Nodes="):].split(","))
                for line in result.text.splitlines() if line.startswith("BlockName=")}
        assert blocks == ours
        base = result.block_sizes[0]
        for size in range(2, base + 1):
            nodes = placed(ctld, size)
            assert len({_domain_of(n) for n in nodes}) == 1, (size, nodes)
    finally:
        ctld.stop()


@pytest.mark.parametrize("busy, expected", [
    ("nvl-b3", {"nvl-a0", "nvl-a1", "nvl-a2", "nvl-a3"}),  # the one domain with room
    ("nvl-a0,nvl-b0", None),  # no domain has 4 free: the job waits (BlockSizes=2 put it on nvl-b[1-3],nvl-c0)
])
def test_a_job_of_one_domain_waits_rather_than_straddle_two(tmp_path, busy, expected):
    hosts = CASES["4-4-2"]
    ctld, _ = start(tmp_path, build_topology_conf(hosts).text, [h.name for h in hosts])
    try:
        assert ctld.run("update", f"nodename={busy}", "state=drain", "reason=busy").returncode == 0
        result = ctld.run("--test-only", "-N", "4", "--wrap", "true", program=str(SBATCH), timeout=10)
        output = result.stdout + result.stderr
        if expected is None:
            assert "Requested node configuration is not available" in output, output
        else:
            assert placed(ctld, 4) == expected
    finally:
        ctld.stop()
