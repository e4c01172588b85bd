"""Live isolation on cgroup v2 under the container's real systemd (issue 28): with
[isolate] system = true and method = "cgroup", a lease narrows system.slice, user.slice
and init.scope to the housekeeping CPUs (runtime AllowedCPUs=), recorded write-ahead in
the state directory; they are given back when the last lease ends, and at the next start
after a kill -9 of topod.

These hosts mount cgroups hybrid (cpuset on v1): the property is recorded by systemd but
has no effect, so what is asserted is the property (systemctl show) and its restoration;
the cpuset effect is asserted only where the slice has a v2 cpuset, else reported as not
checkable."""

from __future__ import annotations

import json
import warnings

from tier import CONFIG, FIXTURE

from topod.cpulist import parse_cpulist

UNITS = ("system.slice", "user.slice", "init.scope")
RECORD = "/var/lib/topod/isolation-slices.json"
OWNER = "topod-tier-owner"


def _allowed(tier) -> dict[str, list[int]]:
    return {unit: parse_cpulist(",".join(tier.show(unit, "AllowedCPUs")["AllowedCPUs"].split())) for unit in UNITS}


def _configure(tier, system: str, method: str) -> None:
    tier.sh(f"sed -i 's/^system = .*/system = {system}/; s/^method = .*/method = \"{method}\"/' {CONFIG}", check=True)
    reload = tier.sh("systemctl reload topod.service")
    assert reload.returncode == 0, reload.stdout + reload.stderr


def test_slices_narrowed_while_leased_and_given_back_also_after_kill_9(tier):
    # "Given back when the last lease ends" needs this lease to be the last: no other file
    # of the tier may leave one behind (test_systemd_tier's held leases once did).
    assert tier.leases() == [], [lease["id"] for lease in tier.leases()]
    before = _allowed(tier)
    online = parse_cpulist(tier.sh(f"cat {FIXTURE}/sys/devices/system/cpu/online", check=True).stdout.strip())
    _configure(tier, "true", "cgroup")
    lease = None
    try:
        lease = json.loads(tier.sh("topoctl --json allocate --gpus 2 --ttl 600", check=True).stdout)
        housekeeping = sorted(set(online) - set(lease["cpus"]))
        assert lease["cpus"] and housekeeping
        narrowed = {unit: housekeeping for unit in UNITS}
        tier.wait_until(lambda: _allowed(tier) == narrowed, "the slices narrowed to the housekeeping CPUs", 20)
        record = json.loads(tier.sh(f"cat {RECORD}", check=True).stdout)
        assert set(record["units"]) == set(UNITS)
        health = json.loads(tier.sh("topoctl --json status").stdout)["isolation"]
        assert health["method"] == "cgroup" and health["effective"] is False and "no effect" in health["reason"]

        effective = tier.sh("cat /sys/fs/cgroup/system.slice/cpuset.cpus.effective")
        if effective.returncode == 0:
            assert set(parse_cpulist(effective.stdout.strip())) <= set(housekeeping)
        else:
            warnings.warn("system.slice's AllowedCPUs= not checkable for effect: no v2 cpuset.cpus.effective "
                          "(hybrid cgroups: cpuset sits on a v1 hierarchy); asserted as recorded only", stacklevel=1)

        tier.sh(f"topoctl release {lease['id']}", check=True)
        lease = None
        tier.wait_until(lambda: _allowed(tier) == before, "the slices given back when the last lease ended", 20)
        assert tier.sh(f"test -e {RECORD}").returncode != 0, "the record goes with the restoration"

        # kill -9 while narrowed: the record survives, the next start gives the slices back
        # (the lease's owner died meanwhile, so no lease narrows them again).
        tier.sh(f"systemctl stop {OWNER} 2>/dev/null; systemctl reset-failed {OWNER} 2>/dev/null; "
                f"systemd-run --unit={OWNER} sleep 300", check=True)
        owner = tier.wait_until(lambda: int(tier.show(f"{OWNER}.service", "MainPID")["MainPID"]), "owner pid")
        tier.sh(f"topoctl --json allocate --gpus 1 --owner-pid {owner}", check=True)
        tier.wait_until(lambda: _allowed(tier)["system.slice"] != before["system.slice"], "narrowed again", 20)
        since = tier.now_usec()
        tier.sh("systemctl kill -s KILL topod.service; systemctl stop topod.socket topod.service", check=True)
        assert _allowed(tier)["system.slice"] != before["system.slice"], "a crash gives nothing back by itself"
        assert tier.sh(f"test -e {RECORD}").returncode == 0
        tier.sh(f"systemctl stop {OWNER}", check=True)
        tier.sh("systemctl start topod.socket topod.service", check=True)
        tier.wait_until(lambda: _allowed(tier) == before, "the slices given back at the start after the crash", 30)
        assert tier.sh(f"test -e {RECORD}").returncode != 0
        restored = [e for e in tier.journal("-u", "topod.service", since=since)
                    if "isolation_restored" in str(e.get("MESSAGE"))]
        assert any("after=crash" in e["MESSAGE"] or e.get("AFTER") == "crash" for e in restored), restored
    finally:
        if lease is not None:
            tier.sh(f"topoctl release {lease['id']}")
        tier.sh(f"systemctl stop {OWNER} 2>/dev/null; systemctl reset-failed {OWNER} 2>/dev/null")
        tier.sh("systemctl start topod.socket topod.service")
        _configure(tier, "false", "auto")
