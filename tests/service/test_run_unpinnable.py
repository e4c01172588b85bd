"""topoctl run never claims more enforcement than it did: a lease whose CPUs this process
cannot use (another host's tree, an affinity narrowed by a launcher) is `none`, said with
the reason, not `affinity`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from topod.cpulist import format_cpulist
from topod.pinning import partial_pinning

REPO = Path(__file__).resolve().parents[2]


def test_a_lease_whose_cpus_are_out_of_reach_is_enforcement_none(daemon_factory):
    daemon = daemon_factory("pcie-8gpu", config='[alloc]\nhousekeeping_cores_per_node = 0\n'  # CPU 0 leasable
                                                '[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    client = daemon.start()
    held = client.allocate(1, must_include=[0], cpus_per_gpu=2, level="any")
    assert 0 in held["cpus"], held["cpus"]  # CPU 0 held elsewhere: the run's lease cannot have it
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "--socket", daemon.socket, "--json", "run",
                           "--gpus", "1", "--must-include", "2", "--cpus-per-gpu", "2", "--", "true"],
                          capture_output=True, text=True, env=env, timeout=60,
                          preexec_fn=lambda: os.sched_setaffinity(0, {0}))  # a launcher's narrow mask
    report = json.loads(done.stdout.splitlines()[0])
    lease_cpus = report["scope"]["AllowedCPUs"]
    assert "0" not in lease_cpus.replace("-", ",").split(","), lease_cpus  # the precondition: CPU 0 not leased
    assert report["enforcement"] == "none", report
    assert "nothing is pinned" in report["reason"] and "nothing is pinned" in done.stderr
    assert done.returncode == 0 and [lease["id"] for lease in client.leases()] == [held["id"]]


def test_a_lease_pinned_to_only_some_of_its_cpus_says_which_are_missing(daemon_factory):
    """The kernel pins to the CPUs it can (sched_setaffinity keeps a mask's usable part
    without an error): a lease from the h800 tree names CPUs this small machine lacks, and
    the job is told which, on stderr, before it runs."""
    from topod.cpulist import parse_cpulist

    daemon = daemon_factory("h800-8gpu", config='[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    daemon.start()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    show = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "--socket", daemon.socket, "--json", "run",
                           "--gpus", "1", "--must-include", "0", "--", sys.executable, "-c", show],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    report, pinned_line = done.stdout.splitlines()[:2]
    leased = set(parse_cpulist(json.loads(report)["scope"]["AllowedCPUs"]))
    here = os.sched_getaffinity(0)
    if leased <= here or not leased & here:
        pytest.skip(f"this machine has all or none of the lease's CPUs ({sorted(leased)}): no partial pinning")
    pinned = {int(cpu) for cpu in pinned_line.split(",")}
    assert pinned == leased & here
    warning = [line for line in done.stderr.splitlines() if "WARNING: pinned to CPUs" in line]
    assert len(warning) == 1, done.stderr
    missing = sorted(leased - pinned)
    assert f"the lease's CPUs {format_cpulist(missing)} are not available" in warning[0]


def test_partial_pinning_names_exactly_the_cpus_the_job_lacks():
    assert partial_pinning([0, 1, 2, 3], {0, 1, 2, 3}) is None
    assert partial_pinning([], set()) is None
    said = partial_pinning([0, 1, 2, 32, 33, 34], {0, 1})  # README's example
    assert said.startswith("pinned to CPUs 0-1 only: the lease's CPUs 2,32-34 are not available to this process (")
