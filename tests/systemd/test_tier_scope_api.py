"""Issue 28 under the container's real systemd: a local scheduler places a running process
in its lease's scope (POST /v1/leases/{id}/scope, here through `topoctl scope`), the lease
ends when that scope ends (systemd's signals), and `topoctl run --journal` puts the job's
output in the journal under the lease's scope."""

from __future__ import annotations

import json
import uuid

from topod.cpulist import parse_cpulist

HOLDER = "topod-tier-holder"


def _ids(shown: str) -> list[int]:
    return parse_cpulist(",".join(shown.split()))


def test_a_running_process_is_placed_in_its_lease_scope_and_its_end_ends_the_lease(tier):
    tier.sh(f"systemctl stop {HOLDER} 2>/dev/null; systemctl reset-failed {HOLDER} 2>/dev/null")
    # A process a scheduler started elsewhere (here: a service of its own).
    tier.sh(f"systemd-run --unit={HOLDER} sleep 300", check=True)
    pid = tier.wait_until(lambda: int(tier.show(f"{HOLDER}.service", "MainPID")["MainPID"]), "the holder's pid")
    lease = json.loads(tier.sh("topoctl --json allocate --gpus 1 --job sched-tier --ttl 600", check=True).stdout)
    try:
        placed = tier.sh(f"topoctl --json scope {lease['id']} {pid}")
        assert placed.returncode == 0, placed.stdout + placed.stderr
        answer = json.loads(placed.stdout)
        unit = f"topod-lease-{lease['id']}.scope"
        assert answer["scope"] == unit and answer["created"] is True and answer["pid"] == pid
        # The daemon serves a fixture tree (not this host): it claims nothing for the CPUs.
        assert answer["enforcement"] == "none" and answer["host_enforcement"] == "none", answer
        shown = tier.show(unit, "ActiveState", "AllowedCPUs", "AllowedMemoryNodes", "DevicePolicy", "Slice")
        assert shown["ActiveState"] == "active"
        assert shown["Slice"] == "topod.slice", "beside system.slice, which live isolation narrows"
        assert _ids(shown["AllowedCPUs"]) == lease["cpus"] and _ids(shown["AllowedMemoryNodes"]) == \
            lease["memory_nodes"], shown
        assert shown["DevicePolicy"] == "closed"
        cgroups = tier.sh(f"cat /proc/{pid}/cgroup", check=True).stdout.splitlines()
        assert any(line.endswith(f"/topod.slice/{unit}") for line in cgroups), cgroups
        recorded = next(item for item in tier.leases() if item["id"] == lease["id"])
        assert recorded["scope"] == unit

        # Someone else's lease: refused for a user, whatever the pid.
        alice = tier.sh(f"topoctl scope {lease['id']} {pid}", user="alice")
        assert alice.returncode != 0 and "belongs to uid 0" in alice.stderr, alice.stderr

        tier.sh(f"kill {pid}", check=True)  # the scope's last process: the scope, then the lease, end
        tier.wait_until(lambda: all(item["id"] != lease["id"] for item in tier.leases()),
                        "the lease ends with its scope", timeout=20)
        journal = tier.sh("journalctl -u topod.service -o cat --no-pager | grep -E 'lease_scope_(placed|ended)'").stdout
        assert "lease_scope_placed" in journal and "lease_scope_ended" in journal and lease["id"] in journal, journal
    finally:
        tier.sh(f"topoctl release {lease['id']} 2>/dev/null; systemctl stop {HOLDER} 2>/dev/null; "
                f"systemctl reset-failed {HOLDER} 2>/dev/null")


def test_a_users_topoctl_run_journal_gets_its_scope_from_topod_and_its_output_under_it(tier):
    word = uuid.uuid4().hex[:10]
    since = tier.now_usec()
    # alice (group topod, not root): systemd refuses her a unit (no polkit rule), so topoctl
    # run asks topod to place her command, then the output goes to the journal from inside.
    done = tier.sh(f"topoctl --json run --journal --gpus 1 --job journal-tier -- "
                   f"sh -c 'echo out-{word}; echo err-{word} >&2; sleep 1'", user="alice", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.splitlines()[0])
    assert report["scope"]["created"] is True and report["scope"]["by"] == "topod", report
    assert f"out-{word}" not in done.stdout and f"err-{word}" not in done.stderr, "in the journal, not here"
    unit = f"topod-lease-{report['lease']}.scope"

    def entries():
        found = [e for e in tier.journal(f"_SYSTEMD_UNIT={unit}", since=since) if word in str(e.get("MESSAGE"))]
        return found if len(found) >= 2 else None

    found = tier.wait_until(entries, f"the job's two lines under {unit}", timeout=20)
    by_message = {e["MESSAGE"]: e for e in found}
    assert by_message[f"out-{word}"]["PRIORITY"] == "6" and by_message[f"err-{word}"]["PRIORITY"] == "3"
    assert by_message[f"out-{word}"]["SYSLOG_IDENTIFIER"] == "journal-tier"
    shown = tier.sh(f"journalctl -u {unit} -o cat --no-pager").stdout
    assert f"out-{word}" in shown and f"err-{word}" in shown, shown
    # the lease ended with the run, and topod stopped the scope it made
    tier.wait_until(lambda: tier.show(unit, "ActiveState")["ActiveState"] in ("inactive", "failed"),
                    f"{unit} gone with its lease", timeout=20)
    assert all(item["id"] != report["lease"] for item in tier.leases())
