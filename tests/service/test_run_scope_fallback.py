"""topoctl run where systemd cannot be reached on the system bus (this machine; or a bus
address that points nowhere): the command still runs pinned by affinity, and topoctl says
plainly that no scope holds it, on stderr and in --json (never enforcement cgroup); what
it says of the lease's enforcement is what the lease itself says (on a captured tree:
none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_topoctl_run_without_a_system_bus_falls_back_to_affinity_and_says_why(daemon_factory, tmp_path):
    daemon = daemon_factory()
    client = daemon.start()
    out = tmp_path / "seen.json"
    script = (f"import json, os; json.dump({{'cpus': sorted(os.sched_getaffinity(0)), "
              f"'leased': os.environ['TOPOD_CPUS'], 'cgroup': open('/proc/self/cgroup').read()}}, "
              f"open({str(out)!r}, 'w'))")
    env = dict(os.environ, TOPOD_SOCKET=daemon.socket, PYTHONPATH=os.getcwd(),
               DBUS_SYSTEM_BUS_ADDRESS=f"unix:path={tmp_path}/no-such-bus")
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "--json", "run", "--gpus", "1",
                           "--cpus-per-gpu", "2", "--job", "fallback", "--", sys.executable, "-c", script],
                          env=env, timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[0])
    # the lease (ended with the command) said what the daemon's health says a lease gets here
    assert report["enforcement"] == client.health()["enforcement"]["leases"] == "none"
    assert report["scope"]["created"] is False
    assert "no system bus" in report["scope"]["reason"]
    assert report["scope"]["unit"] == f"topod-lease-{report['lease']}.scope"
    assert "sched_setaffinity only" in report["reason"]
    assert f"lease {report['lease']} enforcement none" in done.stderr
    from topod.cpulist import parse_cpulist

    seen = json.loads(out.read_text())
    leased = parse_cpulist(seen["leased"])
    assert parse_cpulist(report["scope"]["AllowedCPUs"]) == leased, "what the scope would have had"
    assert set(seen["cpus"]) == set(leased) & os.sched_getaffinity(0), "pinned by affinity all the same"
    assert "topod-lease-" not in seen["cgroup"]
    assert client.leases() == [], "the lease ends with the command"


def test_topoctl_run_reports_a_missing_command_as_127_and_releases(daemon_factory, tmp_path):
    daemon = daemon_factory()
    client = daemon.start()
    env = dict(os.environ, TOPOD_SOCKET=daemon.socket, PYTHONPATH=os.getcwd(),
               DBUS_SYSTEM_BUS_ADDRESS=f"unix:path={tmp_path}/no-such-bus")
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "run", "--gpus", "1", "--",
                           "topod-no-such-command"], env=env, timeout=60, capture_output=True, text=True)
    assert done.returncode == 127
    assert "topod-no-such-command: command not found" in done.stderr
    assert client.leases() == []
