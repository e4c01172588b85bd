"""topod under Debian 12's systemd 252 as PID 1 (a systemd-nspawn container), installed
offline from the wheelhouse with README's commands. The tests share one container and run
in file order: the disruptive ones (watchdog, reboot) come last."""

from __future__ import annotations

import json
import re
import time

import pytest

from tier import CONFIG, FIXTURE, WATCHDOG_SEC

SERVICE = "topod.service"


def _active(tier) -> dict[str, str]:
    return tier.show(SERVICE, "ActiveState", "SubState", "MainPID", "NRestarts", "StatusText")


def _wait_active(tier, other_than: str | None = None, timeout: float = 60) -> dict[str, str]:
    def ready():
        state = _active(tier)
        ok = state["ActiveState"] == "active" and state["SubState"] == "running"
        return state if ok and state["MainPID"] not in ("0", other_than) else None
    return tier.wait_until(ready, f"{SERVICE} active (MainPID other than {other_than})", timeout)


def _allocate(tier, gpus: int, job: str, user: str = "alice") -> dict:
    result = tier.sh(f"topoctl --json allocate --gpus {gpus} --ttl 86400 --job {job}", user=user)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def _lease_view(tier) -> set[tuple]:
    return {(lease["id"], tuple(sorted(g["address"] if isinstance(g, dict) else g for g in lease["gpus"])))
            for lease in tier.leases()}


# --- install and start ---------------------------------------------------------------

def test_offline_install_as_readme_says_then_enable_now_reaches_ready(tier):
    assert tier.enable.returncode == 0, tier.enable.stdout + tier.enable.stderr
    assert "installed topod" in tier.install_output
    state = _active(tier)
    # Type=notify: "active (running)" only after the daemon sent READY=1; STATUS= is set.
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state
    assert state["StatusText"], "the daemon sends STATUS= after READY=1"
    assert tier.show(SERVICE, "Type")["Type"] == "notify"
    assert tier.sh("systemctl is-enabled topod.service topod.socket", check=True).stdout.split() == ["enabled"] * 2
    # The group the socket grants, from sysusers; the directories, from tmpfiles and the unit.
    assert tier.sh("getent group topod").returncode == 0
    assert tier.sh("stat -c '%a %G' /run/topod/topod.sock", check=True).stdout.split() == ["660", "topod"]
    assert tier.sh("stat -c %a /var/lib/topod", check=True).stdout.strip() == "700"
    # It serves the fixture root it was configured with, not the container's own /sys.
    status = json.loads(tier.sh("topoctl --json status", check=True).stdout)
    assert FIXTURE in json.dumps(status) or len(json.loads(tier.sh("topoctl --json topo", check=True).stdout)["gpus"]) == 8


def test_the_installed_units_pass_systemd_analyze_verify(tier):
    result = tier.sh("systemd-analyze verify topod.service topod.socket")
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr.strip() == "", \
        result.stdout + result.stderr


def test_security_exposure_of_the_installed_unit_is_at_most_two(tier):
    for how in ("--offline=yes /usr/lib/systemd/system/topod.service", "topod.service"):
        result = tier.sh(f"systemd-analyze security --no-pager {how}")
        match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
        assert match, f"{how}: {result.stdout[-800:]}{result.stderr}"
        assert float(match.group(1)) <= 2.0, f"{how}: exposure {match.group(1)}"


# --- /proc/irq: the unit's guard and the daemon's ------------------------------------

def test_the_service_cannot_write_proc_irq_in_the_container(tier):
    pid = _active(tier)["MainPID"]
    # In the service's own mount namespace (its fresh /proc from ProtectControlGroups=):
    # /proc/irq is mounted read-only and access(W_OK) is refused. No byte is written.
    probe = """import os
names = [n for n in os.listdir("/proc/irq") if n.isdigit()]
print(len(names))
print(sum(os.access(f"/proc/irq/{n}/smp_affinity_list", os.W_OK) for n in names))
with open("/proc/self/mountinfo") as mounts:
    print("".join(line for line in mounts if line.split()[4] == "/proc/irq"), end="")
"""
    result = tier.sh(f"nsenter -t {pid} -m python3 - <<'EOF'\n{probe}EOF")
    assert result.returncode == 0, result.stdout + result.stderr
    count, writable, *mounts = result.stdout.splitlines()
    assert int(count) > 0, "the service sees the host's IRQs (so the check means something)"
    assert int(writable) == 0, f"{writable} of {count} /proc/irq/N/smp_affinity_list writable by the service"
    assert mounts and all(line.split()[5].startswith("ro") for line in mounts), mounts


def test_the_daemon_withholds_irq_writes_in_a_container(tier):
    # [irq] mode = "continuous" (the packaged config) on a root that says it is a container,
    # whose IRQ files the unit lets the service write (the tier's drop-in).
    assert tier.sh(f"grep -q '^mode = \"continuous\"' {CONFIG}").returncode == 0
    lines = tier.journal("_SYSTEMD_UNIT=topod.service", "TOPOD_EVENT=host_access")
    assert lines, "no host_access line in the journal"
    summary = lines[-1]["TOPOD_SUMMARY"]
    assert "plans IRQ affinity but writes nothing" in summary and "container" in summary, summary
    assert "IRQ writes withheld" in _active(tier)["StatusText"]
    # The plan would move IRQs (the fixture has them all on CPU 0): an unguarded daemon writes.
    plan = json.loads(tier.sh(f"topoctl --json irq plan --root {FIXTURE}", check=True).stdout)
    wanted = [irq["irq"] for irq in plan["irqs"] if irq["planned"] and irq["planned"] != irq["current"]]
    assert wanted, "the plan moves nothing, so this test could not see a write"
    time.sleep(3)  # three IRQ cycles at interval_seconds = 1
    current = tier.sh(f"cat {FIXTURE}/proc/irq/*/smp_affinity_list | sort -u", check=True).stdout.split()
    assert current == ["0"], f"the daemon wrote IRQ affinity in a container: {current}"
    assert not tier.journal("_SYSTEMD_UNIT=topod.service", "TOPOD_EVENT=irq_moved")


# --- socket activation and authorization ---------------------------------------------

def test_socket_activation_starts_the_service_on_first_connect(tier):
    old = _active(tier)["MainPID"]
    tier.sh("systemctl stop topod.service", check=True)
    assert tier.show(SERVICE, "ActiveState")["ActiveState"] == "inactive"
    assert tier.show("topod.socket", "ActiveState")["ActiveState"] == "active"
    assert tier.sh("test -S /run/topod/topod.sock").returncode == 0, "the socket outlives the service"
    result = tier.sh("topoctl status")  # connects, queues until the daemon is ready
    assert result.returncode == 0, result.stdout + result.stderr
    assert _wait_active(tier, other_than=old)["MainPID"] != old


def test_a_user_outside_group_topod_is_refused_and_a_member_allowed(tier):
    refused = tier.sh("topoctl status", user="bob")
    assert refused.returncode != 0
    assert "topod" in refused.stderr and re.search(r"permission|group", refused.stderr, re.I), refused.stderr
    granted = _allocate(tier, 1, "authz")
    lease_id = granted.get("id") or granted["lease"]["id"]
    assert tier.sh(f"topoctl release {lease_id}", user="alice").returncode == 0


def test_journal_entries_carry_structured_fields(tier):
    since = tier.now_usec()
    granted = _allocate(tier, 1, "journal")
    lease_id = granted.get("id") or granted["lease"]["id"]
    try:
        entries = tier.wait_until(lambda: tier.journal("TOPOD_EVENT=lease_granted", since=since),
                                  "a lease_granted journal entry", timeout=15)
        entry = entries[-1]
        assert entry["TOPOD_LEASE"] == lease_id, entry
        assert entry["_SYSTEMD_UNIT"] == SERVICE and entry["SYSLOG_IDENTIFIER"] == "topod"
        assert entry["MESSAGE"] and entry["PRIORITY"] in "0123456"
    finally:
        tier.sh(f"topoctl release {lease_id}", user="alice")


# --- reload ----------------------------------------------------------------------------

def test_reload_with_a_good_config_exits_zero_and_keeps_the_process(tier):
    pid = _active(tier)["MainPID"]
    since = tier.now_usec()
    result = tier.sh("systemctl reload topod")
    assert result.returncode == 0, result.stderr
    tier.wait_until(lambda: tier.journal("TOPOD_EVENT=config_reloaded", since=since),
                    "a config_reloaded journal entry", timeout=15)
    assert _active(tier)["MainPID"] == pid


def _break_config(tier) -> None:
    """The packaged config with one IRQ policy misspelt (a value that does not exist)."""
    tier.sh(f"cp {CONFIG} {CONFIG}.good && sed -i 's|^# rdma = \"spread\"|rdma = \"spred\"|' {CONFIG}"
            f" && grep -q '^rdma = \"spred\"' {CONFIG}", check=True)


def test_reload_with_a_bad_config_exits_non_zero_and_keeps_the_running_config(tier):
    pid = _active(tier)["MainPID"]
    _break_config(tier)
    try:
        assert tier.sh(f"topod --check-config {CONFIG}").returncode != 0, "the file is invalid"
        result = tier.sh("systemctl reload topod")
        state = _active(tier)
        assert state["ActiveState"] == "active" and state["MainPID"] == pid, "a rejected reload changes nothing"
        assert result.returncode != 0, "systemctl reload exited 0 for a rejected config"
    finally:
        tier.sh(f"mv {CONFIG}.good {CONFIG}", check=True)
    assert tier.sh("systemctl reload topod").returncode == 0, "the good file is accepted again"


def test_a_config_error_at_start_fails_once_and_is_not_restarted(tier):
    before = _active(tier)
    since = tier.now_usec()
    _break_config(tier)
    try:
        assert tier.sh("systemctl restart topod").returncode != 0
        time.sleep(5)  # more than RestartSec=2s: a restart would have happened by now
        state = tier.show(SERVICE, "ActiveState", "Result", "ExecMainStatus", "NRestarts")
        assert state["ActiveState"] == "failed" and state["ExecMainStatus"] == "78", state
        assert state["NRestarts"] == before["NRestarts"], "systemd restarted a daemon that cannot start"
        lines = [e["MESSAGE"] for e in tier.journal("_SYSTEMD_UNIT=topod.service", since=since)
                 if e.get("SYSLOG_IDENTIFIER") == "topod"]
        assert any("spred" in line for line in lines), lines
    finally:
        tier.sh(f"mv {CONFIG}.good {CONFIG}", check=True)
        tier.sh("systemctl reset-failed topod.service; systemctl start topod.service")
    _wait_active(tier)


# --- leases survive what systemd does to the service ---------------------------------

@pytest.fixture(scope="module")
def held(tier):
    """Two leases the rest of the file expects to outlive restarts, a watchdog kill, a reboot."""
    _allocate(tier, 2, "held-a")
    _allocate(tier, 1, "held-b")
    view = _lease_view(tier)
    assert len(view) == 2
    yield view
    # Given back after this file: the tier's later files start from a host with no lease.
    for lease_id, _ in view:
        tier.sh(f"topoctl release {lease_id}", user="alice")


def test_restart_keeps_leases(tier, held):
    old = _active(tier)["MainPID"]
    tier.sh("systemctl restart topod", check=True)
    assert _wait_active(tier, other_than=old)["MainPID"] != old
    assert _lease_view(tier) == held


def test_a_killed_worker_is_replaced_and_the_service_stays_up(tier, held):
    state = _active(tier)
    children = tier.sh(f"ps --ppid {state['MainPID']} -o pid= -o args=", check=True).stdout.split("\n")
    workers = [line.split()[0] for line in children if "irq_worker" in line]
    assert workers, f"the daemon runs its IRQ worker as a child process: {children}"
    tier.sh(f"kill -9 {workers[0]}", check=True)

    def replaced():
        now = [line.split()[0] for line in tier.sh(f"ps --ppid {state['MainPID']} -o pid= -o args=").stdout.split("\n")
               if "irq_worker" in line]
        return now and workers[0] not in now
    tier.wait_until(replaced, "a new worker process", timeout=30)
    after = _active(tier)
    assert (after["MainPID"], after["NRestarts"]) == (state["MainPID"], state["NRestarts"])
    assert json.loads(tier.sh("topoctl --json status", check=True).stdout)
    assert _lease_view(tier) == held


def test_watchdog_restarts_a_stopped_daemon_and_leases_survive(tier, held):
    state = _active(tier)
    since = tier.now_usec()
    tier.sh("systemctl kill --kill-who=main --signal=SIGSTOP topod.service", check=True)
    stopped_at = time.monotonic()
    after = _wait_active(tier, other_than=state["MainPID"], timeout=WATCHDOG_SEC + 40)
    took = time.monotonic() - stopped_at
    assert int(after["NRestarts"]) == int(state["NRestarts"]) + 1
    assert took >= WATCHDOG_SEC - 1, f"restarted after {took:.1f}s, before the watchdog could fire"
    messages = [e.get("MESSAGE", "") for e in tier.journal("_PID=1", since=since)]
    assert any("Watchdog timeout" in m for m in messages), messages[-10:]
    assert _lease_view(tier) == held


def test_reboot_keeps_leases_and_starts_the_enabled_units(tier, held):
    tier.poweroff()
    started = time.monotonic()
    tier.boot()
    _wait_active(tier)
    tier.timings["reboot"] = time.monotonic() - started
    assert _lease_view(tier) == held
