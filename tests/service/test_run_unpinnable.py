"""topoctl run never claims more enforcement than it did: a lease whose CPUs this process
cannot use (another host's tree, an affinity narrowed by a launcher) is `none`, said with
the reason, not `affinity`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_lease_whose_cpus_are_out_of_reach_is_enforcement_none(daemon_factory):
    daemon = daemon_factory("pcie-8gpu", config='[irq]\nmode = "off"\n[probe]\nenabled = false\n')
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
