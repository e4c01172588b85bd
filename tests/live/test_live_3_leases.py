"""Leases without GPUs on a real kernel: IRQ avoidance, cgroup v2 enforcement, isolation
of the system slices, and leases surviving kill -9 and a reboot.

The guest has no GPU: every test here leases CPUs near a device
(POST /v1/leases {"gpus": 0, "cpus": N, "near": DEV}). Each skips, saying why, while the
daemon answers that such a request is invalid (gpus must be >= 1)."""

from __future__ import annotations

import json
import shlex

from guest import NODE_CPUS
from livetier import (affinities, api, gpuless_lease, gpuless_request, granted_or_skip, irq_report, leases, release,
                      require_gpuless_leases)

from topod.cpulist import parse_cpulist

CONFIG = "/etc/topod/topod.toml"
SLICES = ("system.slice", "user.slice")


def _nvme_on_node(guest, node: int) -> str:
    """The kernel name (nvme0, nvme1, ...) of the NVMe on `node`: names follow probe order,
    which is not the slot order, so it is looked up by the serial the guest gave it."""
    serial = f"topod-n{node}"
    out = guest.sh("grep -H . /sys/class/nvme/nvme*/serial", check=True).stdout
    for line in out.splitlines():
        path, _, value = line.partition(":")
        if value.strip() == serial:
            return path.split("/")[4]
    raise AssertionError(f"no NVMe with serial {serial}: {out}")


def _movable_on(guest, cpus: set[int]) -> list[tuple[int, tuple[int, ...]]]:
    """Movable vectors (topod's plan writes them) whose smp_affinity_list touches `cpus`."""
    report = irq_report(guest)
    kernel = affinities(guest)
    movable = [e["irq"] for e in report.get("irqs", []) if e["planned"] is not None
               and e["status"] not in ("managed", "refused")]
    return [(irq, kernel[irq][0]) for irq in movable if irq in kernel and set(kernel[irq][0]) & cpus]


def _effective(guest, unit: str, file: str) -> list[int]:
    """A cgroup's cpuset file; without one (systemd enables the cpuset controller below the
    root only once a unit asks for it) the unit is not restricted: every online CPU/node."""
    fallback = "/sys/devices/system/cpu/online" if "cpus" in file else "/sys/devices/system/node/online"
    return parse_cpulist(guest.sh(f"cat /sys/fs/cgroup/{unit}/{file} 2>/dev/null || cat {fallback}",
                                  check=True).stdout.strip())


def _set_isolation(guest, on: bool) -> None:
    guest.sh(f"sed -i 's/^system = .*/system = {'true' if on else 'false'}/' {CONFIG}", check=True)
    guest.sh("systemctl reload topod.service", check=True)


def _kill_9_and_wait(guest) -> None:
    pid = guest.sh("systemctl show -p MainPID --value topod.service", check=True).stdout.strip()
    guest.sh(f"kill -9 {pid}", check=True)
    guest.wait_until(lambda: (now := guest.sh("systemctl show -p MainPID --value topod.service").stdout.strip())
                     not in ("0", pid) and api(guest, "GET", "/v1/health")[0] == 200,
                     "topod restarted after kill -9", 300, 2)


# In the guest, so that the time from the 201 to the last vector leaving the CPU is not
# the agent's round trips: lease, then poll the movable vectors' smp_affinity_list.
_LEASE_AND_WATCH = r"""
import http.client, json, socket, sys, time
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect("/run/topod/topod.sock")
def request(method, path, body=None):
    connection = Unix("topod", timeout=120)
    connection.request(method, path, body=json.dumps(body) if body else None,
                       headers={"Content-Type": "application/json"} if body else {})
    answer = connection.getresponse()
    return answer.status, json.loads(answer.read() or b"null")
def cpus_of(text):
    out = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out
irqs, body = json.loads(sys.argv[1]), json.loads(sys.argv[2])
cycles = request("GET", "/v1/irqs")[1].get("cycles", 0)
status, lease = request("POST", "/v1/leases", body)
granted = time.monotonic()
result = {"status": status, "lease": lease, "cycles_before": cycles}
if status == 201:
    leased = set(lease["cpus"])
    def touching():
        return [irq for irq in irqs if cpus_of(open(f"/proc/irq/{irq}/smp_affinity_list").read()) & leased]
    while touching() and time.monotonic() < granted + 120:
        time.sleep(0.02)
    result.update(seconds=time.monotonic() - granted, left=touching(),
                  cycles_after=request("GET", "/v1/irqs")[1].get("cycles", 0))
print(json.dumps(result))
"""


def test_a_lease_near_the_node_1_nvme_clears_its_cpu_of_movable_vectors_within_one_cycle(guest):
    nvme = _nvme_on_node(guest, 1)
    movable = [e["irq"] for e in irq_report(guest).get("irqs", []) if e["planned"] is not None
               and e["status"] not in ("managed", "refused")]
    out = guest.exec(["/usr/bin/python3", "-I", "-c", _LEASE_AND_WATCH, json.dumps(movable),
                      json.dumps(gpuless_request(1, nvme))], timeout=300)
    assert out.returncode == 0, out.stderr
    watched = json.loads(out.stdout)
    lease = granted_or_skip(watched["status"], watched["lease"], 1, nvme)
    try:
        cpus = set(lease["cpus"])
        assert cpus and cpus <= set(NODE_CPUS[1]), lease
        assert watched["left"] == [], f"still on CPU {sorted(cpus)} after 120 s: {watched['left']}"
        # a re-plan on the lease change, at the latest the next full cycle: never a later one
        assert watched["cycles_after"] <= watched["cycles_before"] + 1, watched
    finally:
        release(guest, lease["id"])
    # Given back: the next plans spread node 1's vectors over that CPU again.
    guest.wait_until(lambda: _movable_on(guest, cpus), f"movable vectors back on CPU {sorted(cpus)}", 120, 2)
    print(f"\nlive: lease of CPU {sorted(cpus)} near {nvme}: no movable vector on it {watched['seconds']:.2f} s "
          f"after the 201 (IRQ cycles {watched['cycles_before']} -> {watched['cycles_after']}; TCG)")


def test_topoctl_run_holds_the_job_in_its_scopes_cpuset_and_it_cannot_widen_it(guest):
    nvme = _nvme_on_node(guest, 1)
    require_gpuless_leases(guest, nvme)
    job = ("cg=$(cut -d: -f3 /proc/self/cgroup); echo cgroup=$cg; "
           "echo cpus=$(cat /sys/fs/cgroup$cg/cpuset.cpus.effective); "
           "echo mems=$(cat /sys/fs/cgroup$cg/cpuset.mems.effective); "
           "echo env_cpus=$TOPOD_CPUS; echo env_nodes=$TOPOD_MEMORY_NODES; echo lease=$TOPOD_LEASE; "
           "python3 -c 'import os; os.sched_setaffinity(0, range(4)); print(\"widened=\" + "
           "\",\".join(map(str, sorted(os.sched_getaffinity(0)))))'; "
           "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status")
    result = guest.sh(f"topoctl --json run --cpus 1 --near {nvme} -- sh -c {shlex.quote(job)}", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    outcome = json.loads(next(line for line in lines if line.startswith("{")))
    seen = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("{"))
    assert outcome["enforcement"] == "cgroup", outcome
    assert seen["cgroup"].endswith(f"topod-lease-{seen['lease']}.scope"), seen
    assert parse_cpulist(seen["cpus"]) == parse_cpulist(seen["env_cpus"]), seen
    assert parse_cpulist(seen["mems"]) == [int(n) for n in seen["env_nodes"].split(",")] == [1], seen
    # sched_setaffinity to every CPU: the cpuset keeps the job inside its lease.
    assert parse_cpulist(seen["widened"]) == parse_cpulist(seen["cpus"]), seen


def test_lease_health_and_topoctl_run_say_the_same_enforcement(guest):
    """A lease with no scope gets what health says a lease gets (affinity: topod pins, the
    job may undo it); the lease topoctl run makes is in its scope, and the lease itself
    (read by the job while it runs), topoctl run's answer and its stderr all say cgroup."""
    nvme = _nvme_on_node(guest, 1)
    lease = gpuless_lease(guest, cpus=1, near=nvme, ttl=120)
    try:
        health = api(guest, "GET", "/v1/health")[1]["enforcement"]
        listed = api(guest, "GET", f"/v1/leases/{lease['id']}")[1]
    finally:
        release(guest, lease["id"])
    assert lease["enforcement"] == listed["enforcement"] == health["leases"] == "affinity", (lease, health)
    assert health["host"] == "cgroup", health
    job = ("topoctl --json leases $TOPOD_LEASE | python3 -c "
           "'import json, sys; print(\"lease_enforcement=\" + json.load(sys.stdin)[\"enforcement\"])'")
    result = guest.sh(f"topoctl --json run --cpus 1 --near {nvme} -- sh -c {shlex.quote(job)}", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    seen_by_job = next(line.split("=", 1)[1] for line in result.stdout.splitlines()
                       if line.startswith("lease_enforcement="))
    assert outcome["enforcement"] == seen_by_job == "cgroup", (outcome, seen_by_job)
    assert "enforcement" not in result.stderr, result.stderr  # said on stderr only when not cgroup


def test_isolation_moves_the_system_off_leased_cpus_and_gives_them_back_also_after_kill_9(guest):
    nvme = _nvme_on_node(guest, 1)
    before = {unit: _effective(guest, unit, "cpuset.cpus.effective") for unit in SLICES}
    _set_isolation(guest, True)
    try:
        lease = gpuless_lease(guest, cpus=1, near=nvme)
        leased = set(lease["cpus"])

        def isolated() -> bool:
            units = all(not leased & set(_effective(guest, u, "cpuset.cpus.effective")) for u in SLICES)
            init = parse_cpulist(guest.sh("grep Cpus_allowed_list /proc/1/status").stdout.split()[-1])
            return units and not leased & set(init)
        guest.wait_until(isolated, f"system.slice, user.slice and PID 1 off CPU {sorted(leased)}", 120, 2)
        _kill_9_and_wait(guest)
        guest.wait_until(isolated, "still isolated after kill -9 (the lease lives)", 120, 2)
        release(guest, lease["id"])
        guest.wait_until(lambda: {u: _effective(guest, u, "cpuset.cpus.effective") for u in SLICES} == before,
                         "the slices given their CPUs back", 120, 2)
    finally:
        _set_isolation(guest, False)


def test_kill_9_under_allocation_load_loses_no_lease_and_a_reboot_keeps_every_lease_and_isolation(guest):
    nvme = _nvme_on_node(guest, 1)
    held = gpuless_lease(guest, cpus=1, near=nvme, ttl=3600)
    # A loader in the guest: allocate, record, release, record; kill -9 lands mid-way.
    loader = ("while :; do out=$(topoctl --json allocate --cpus 1 --ttl 600 2>/dev/null) || continue; "
              "id=$(echo \"$out\" | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"id\"])'); "
              "echo \"granted $id\" >> /root/load.log; topoctl release $id >/dev/null 2>&1 && "
              "echo \"released $id\" >> /root/load.log; done")
    guest.sh(f"rm -f /root/load.log; systemd-run --unit topod-load sh -c {shlex.quote(loader)}", check=True)
    try:
        guest.wait_until(lambda: guest.sh("grep -c released /root/load.log").stdout.strip() not in ("", "0"),
                         "the loader's first release", 300, 2)
        _kill_9_and_wait(guest)
        guest.wait_until(lambda: int(guest.sh("grep -c released /root/load.log").stdout.strip() or 0) > 2,
                         "the loader going on after the restart", 300, 2)
    finally:
        guest.sh("systemctl stop topod-load")
    log = guest.sh("cat /root/load.log", check=True).stdout.split()
    granted = {log[i + 1] for i in range(0, len(log) - 1, 2) if log[i] == "granted"}
    released = {log[i + 1] for i in range(0, len(log) - 1, 2) if log[i] == "released"}
    listed = {lease["id"] for lease in leases(guest)}
    assert held["id"] in listed
    assert granted - released <= listed, f"granted, never released, yet gone: {granted - released - listed}"

    # The reboot: every lease comes back, and with isolation on the slices leave its CPUs again.
    before = {lease["id"]: lease for lease in leases(guest)}
    slices = {unit: _effective(guest, unit, "cpuset.cpus.effective") for unit in SLICES}
    _set_isolation(guest, True)
    try:
        seconds = guest.reboot()
        guest.wait_until(lambda: api(guest, "GET", "/v1/health")[0] == 200, "topod up after the reboot", 600, 3)
        after = {lease["id"]: lease for lease in leases(guest)}
        assert set(after) == set(before), (sorted(before), sorted(after))
        for lease_id, lease in before.items():
            assert after[lease_id]["cpus"] == lease["cpus"], (lease, after[lease_id])
        leased = {cpu for lease in after.values() for cpu in lease["cpus"]}
        guest.wait_until(lambda: all(not leased & set(_effective(guest, u, "cpuset.cpus.effective")) for u in SLICES),
                         f"the slices off CPUs {sorted(leased)} after the reboot", 300, 3)
        for lease_id in after:
            release(guest, lease_id)
        guest.wait_until(lambda: {u: _effective(guest, u, "cpuset.cpus.effective") for u in SLICES} == slices,
                         "the slices given their CPUs back after the reboot", 120, 2)
    finally:
        _set_isolation(guest, False)
    print(f"\nlive: reboot took {seconds:.0f} s; {len(after)} lease(s) kept; "
          f"{len(granted)} granted under load around a kill -9, none lost")
