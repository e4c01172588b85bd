"""The daemon as users start it (its own defaults plus only --root, --socket,
--state-dir on a fixture tree), driven through failures, with invariants checked after
every step: no unhandled exception in the log, no lease lost, no GPU in two leases,
health answers, the watchdog keeps pinging."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from topod.client import ApiError


WATCHDOG_USEC = 1_000_000  # pings every 0.5 s
LINK_TABLES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
PROMTOOL = shutil.which("promtool")


def live_profile(table: Path = LINK_TABLES / "pcie-8gpu-uplink-degrades.json") -> str:
    """What defaults on for `/`, on a fixture root: link probing (the simulated backend
    stands in for host memory copies, which would measure this machine), IRQ balancing
    in the daemon's default mode through its worker process."""
    return (f'[probe]\nbackend = "simulated"\nsimulated_table = "{table}"\n'
            "min_interval_seconds = 1.0\nmax_interval_seconds = 5.0\n")


def scrape_metrics(socket_path: str) -> tuple[int, str]:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.connect(socket_path)
    raw.sendall(b"GET /metrics HTTP/1.1\r\nHost: topod\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := raw.recv(65536):
        data += chunk
    raw.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def check_metrics(socket_path: str) -> str:
    """GET /metrics answers 200 and, where promtool is installed, passes its lint."""
    status, text = scrape_metrics(socket_path)
    assert status == 200, text[-2000:]
    assert "topod_build_info" in text
    if PROMTOOL:
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    return text


class NotifyListener:
    """A stand-in for systemd's notify socket: collects the daemon's datagrams."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, OSError):
                continue
            self.messages.append((time.monotonic(), data.decode("utf-8", "replace")))

    def pings_since(self, since: float) -> int:
        return sum(1 for at, text in self.messages if at >= since and "WATCHDOG=1" in text.split("\n"))

    def statuses(self) -> list[str]:
        return [line[len("STATUS="):] for _, text in self.messages for line in text.split("\n")
                if line.startswith("STATUS=")]

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


def _wait_until(predicate, timeout: float = 10.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


class Scenario:
    def __init__(self, daemon_factory, tmp_path: Path, host: str = "h800-8gpu", config: str | None = None) -> None:
        self.notify = NotifyListener(tmp_path / "notify.sock")
        self.daemon = daemon_factory(host, config=config, env={"NOTIFY_SOCKET": self.notify.path,
                                                              "WATCHDOG_USEC": str(WATCHDOG_USEC)})
        self.client = self.daemon.start()
        self.granted: dict[str, list[int]] = {}

    def allocate(self, gpus: int, **fields) -> dict:
        lease = self.client.allocate(gpus, **fields)
        self.granted[lease["id"]] = lease["gpus"]
        return lease

    def release(self, lease_id: str) -> None:
        self.client.release(lease_id)
        self.granted.pop(lease_id, None)

    def check(self, *, expect_degraded: bool = False) -> dict:
        health = self.client.health()
        assert health["gpus_free"] >= 0 and health["gpus_free"] <= health["gpus"]
        leases = self.client.leases()
        by_id = {lease["id"]: lease for lease in leases}
        assert set(self.granted) <= set(by_id), f"lease lost: {set(self.granted) - set(by_id)}"
        held = [gpu for lease in leases for gpu in lease["gpus"]]
        assert len(held) == len(set(held)), f"a GPU in two leases: {held}"
        log = self.daemon.log()
        assert "Traceback (most recent call last)" not in log, log[-3000:]
        assert "Task exception was never retrieved" not in log
        since = time.monotonic()
        assert _wait_until(lambda: self.notify.pings_since(since) >= 1, timeout=5), "the watchdog stopped pinging"
        if not expect_degraded:
            assert health["status"] == "ok", health
        check_metrics(self.daemon.socket)
        return health

    def close(self) -> None:
        self.daemon.stop()
        self.notify.close()


@pytest.fixture()
def scenario(daemon_factory, tmp_path):
    made: list[Scenario] = []

    def make(**options) -> Scenario:
        made.append(Scenario(daemon_factory, tmp_path, **options))
        return made[-1]

    yield make
    for item in made:
        item.close()


def test_started_with_defaults_the_daemon_is_ready_balances_irqs_and_reports_probes_off(scenario):
    s = scenario()
    assert any("READY=1" in text for _, text in s.notify.messages)
    assert _wait_until(lambda: set(s.client.health()["loops"]) >=
                       {"reaper", "rescan", "irq", "probe", "api", "load", "exports"})
    health = s.check()
    assert health["hotplug"]["active"] is False, "a captured tree has no udev"
    links = _wait_until(lambda: (answer := s.client.request("GET", "/v1/links")).get("starting") is None and answer)
    assert links["enabled"] is False and "captured tree" in links["reason"]
    assert "no link probes" in s.daemon.log(), "the host_access line says so too"
    assert _wait_until(lambda: s.client.request("GET", "/v1/irqs").get("cycles", 0) >= 1 or
                       s.client.health()["irq"].get("cycles", 0) >= 1)


def test_a_lease_database_deleted_under_the_daemon_refuses_changes_and_says_so_everywhere(scenario):
    """Commits would go into an unlinked file no start reads: every change is refused,
    health is degraded with the reason, systemd's STATUS= names it, what was granted stays."""
    s = scenario()
    lease = s.allocate(1)
    database = Path(s.daemon.state) / "leases.sqlite3"
    database.unlink()
    with pytest.raises(ApiError) as refused:
        s.client.allocate(1)
    assert "was deleted" in str(refused.value)
    health = s.check(expect_degraded=True)
    assert health["status"] == "degraded" and any("was deleted" in reason for reason in health["degraded"])
    assert _wait_until(lambda: any("was deleted" in status for status in s.notify.statuses()), timeout=15)
    assert s.client.lease(lease["id"])["gpus"] == lease["gpus"]


def test_a_failing_rescan_is_survived_reported_once_and_recovers(scenario):
    s = scenario()
    lease = s.allocate(2)
    cpu_dir = s.daemon.root / "sys/devices/system/cpu"
    moved = s.daemon.root / "cpu-moved-away"
    shutil.move(cpu_dir, moved)
    for _ in range(3):  # a reload also rediscovers
        s.daemon.process.send_signal(signal.SIGHUP)
        time.sleep(0.4)
    health = _wait_until(lambda: (h := s.client.health())["loops"]["rescan"]["failures"] >= 2 and h, timeout=15)
    assert health["status"] == "degraded" and health["loops"]["rescan"]["failing"]
    assert any("rescan" in reason for reason in health["degraded"])
    assert s.daemon.process.poll() is None
    failures = [line for line in s.daemon.log().splitlines() if "loop_failed" in line]
    assert len(failures) == 1 and "loop=rescan" in failures[0], "logged once per streak, not per retry"
    s.check(expect_degraded=True)
    assert any("rescan failing" in status for status in s.notify.statuses())
    assert s.client.lease(lease["id"])["gpus"] == lease["gpus"]

    shutil.move(moved, cpu_dir)
    s.daemon.process.send_signal(signal.SIGHUP)
    assert _wait_until(lambda: s.client.health()["status"] == "ok", timeout=15), s.client.health()
    s.check()


def test_a_waiter_that_hangs_up_is_never_granted(scenario):
    s = scenario()
    holder = s.allocate(8, level="any")
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(s.daemon.socket)
    body = json.dumps({"gpus": 4, "wait": 60}).encode()
    raw.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: topod\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert _wait_until(lambda: s.client.health()["waiting"] == 1)
    raw.close()
    assert _wait_until(lambda: s.client.health()["waiting"] == 0), "the waiter goes with its connection"
    s.release(holder["id"])
    time.sleep(0.5)
    assert s.client.leases() == [], "nothing is granted to a client that left"
    assert "request_abandoned" in s.daemon.log()
    s.check()


def test_sighup_switches_the_irq_loop_and_probes_off_and_on(scenario):
    s = scenario(config="")
    s.daemon.config_path.write_text('[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    s.daemon.process.send_signal(signal.SIGHUP)
    assert _wait_until(lambda: "irq" not in s.client.health()["loops"] and "probe" not in s.client.health()["loops"])
    assert s.client.request("GET", "/v1/irqs")["mode"] == "off"
    lease = s.allocate(1)
    s.check()
    s.daemon.config_path.write_text('[irq]\nmode = "dry-run"\ninterval_seconds = 1.0\n')
    s.daemon.process.send_signal(signal.SIGHUP)
    assert _wait_until(lambda: {"irq", "probe"} <= set(s.client.health()["loops"]))
    assert _wait_until(lambda: s.client.health()["irq"].get("cycles", 0) >= 2, timeout=10), "interval applies"
    assert s.client.request("GET", "/v1/irqs")["mode"] == "dry-run"
    assert [l["id"] for l in s.client.leases()] == [lease["id"]]
    s.check()


def test_kill_9_and_restart_keeps_every_acknowledged_lease(scenario):
    s = scenario()
    leases = [s.allocate(2) for _ in range(3)]
    s.daemon.stop(signal.SIGKILL)
    s.client = s.daemon.start()
    s.check()
    assert sorted(l["id"] for l in s.client.leases()) == sorted(l["id"] for l in leases)
    fourth = s.allocate(2)
    assert set(fourth["gpus"]).isdisjoint(g for lease in leases for g in lease["gpus"])
    s.check()


KEPT_UNDER_LOAD = 3


def test_kill_9_under_load_keeps_every_acknowledged_lease_and_no_released_one(scenario):
    """Eight clients grant and release as fast as they can; the daemon is killed -9 in
    the middle. After the restart every lease a client was told it got (and had not
    begun to release) is there, none whose release was answered is, and no GPU is in
    two leases. A lease whose answer never came (in flight at the kill) may be either, but
    if it is there it is unconfirmed and ends within [alloc] unconfirmed_grace_seconds
    (rule 5: a lease no client was told of is never permanent)."""
    from topod.client import ApiError, Client

    s = scenario()
    kept: set[str] = set()  # answered 201, release never started
    released: set[str] = set()  # release answered 200
    ambiguous: set[str] = set()  # release sent, no answer: the kill came in between
    told: set[str] = set()  # every lease whose 201 reached its client
    lock = threading.Lock()
    stop = threading.Event()

    def worker(index: int) -> None:
        client = Client(s.daemon.socket, timeout=5)
        round_ = 0
        while not stop.is_set():
            try:
                lease = client.allocate(1, level="any", cpus_per_gpu=0)
            except (ApiError, OSError):
                if stop.is_set():
                    return
                continue  # a refusal while all 8 are held: try again
            round_ += 1
            with lock:
                told.add(lease["id"])
                keep = round_ == 1 and index < KEPT_UNDER_LOAD  # a few kept for good, the rest rotate
                if keep:
                    kept.add(lease["id"])
            if keep:
                continue
            with lock:
                ambiguous.add(lease["id"])
            try:
                client.release(lease["id"])
            except (ApiError, OSError):
                return
            with lock:
                ambiguous.discard(lease["id"])
                released.add(lease["id"])

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        assert _wait_until(lambda: len(released) >= 40, timeout=30), (len(released), len(kept))
        s.daemon.stop(signal.SIGKILL)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert len(kept) == KEPT_UNDER_LOAD
    s.client = s.daemon.start()
    after = {lease["id"]: lease for lease in s.client.leases()}
    assert kept <= set(after), f"acknowledged leases lost: {kept - set(after)}"
    assert not released & set(after), f"released leases came back: {released & set(after)}"
    grace_end = time.time() + 300.0  # the default unconfirmed_grace_seconds
    for lease_id, lease in after.items():
        if lease_id not in told:
            assert lease["confirmed"] is False and lease["expires"] is not None, lease
            assert lease["expires"] <= grace_end, lease
    s.granted = {lease_id: after[lease_id]["gpus"] for lease_id in kept}
    health = s.check()
    assert health["gpus_free"] == 8 - sum(len(lease["gpus"]) for lease in after.values())


def test_leases_whose_gpus_vanish_turn_degraded_and_counts_stay_sane(daemon_factory, host_tree, tmp_path):
    first = daemon_factory("h800-8gpu", config=None)
    client = first.start()
    kept = client.allocate(4)
    first.stop()
    # the same state dir under another host: the leased GPUs are not there
    second = daemon_factory(config=None, root=host_tree("vm-nogpu"))
    second.state = first.state
    client = second.start()
    health = client.health()
    assert 0 <= health["gpus_free"] <= health["gpus"]
    lease = client.lease(kept["id"])
    assert lease["state"] == "degraded" and sorted(lease["missing_gpus"]) == sorted(kept["gpus"])
    assert health["status"] == "degraded" and any(kept["id"] in reason for reason in health["degraded"])
    assert "lease_degraded" in second.log()
    assert health["gpus"] == 0 and health["gpus_free"] == 0, "never negative"
    second.stop()
    # back on the first host, the lease is whole again
    third = daemon_factory(config=None, root=first.root)
    third.state = first.state
    client = third.start()
    assert client.lease(kept["id"])["state"] == "active" and client.lease(kept["id"])["missing_gpus"] == []
    assert client.health()["gpus_free"] == 4


def test_on_the_live_root_the_hotplug_source_is_udev(daemon_factory, tmp_path):
    # Read-only on this machine: IRQ balancing off, no probes.
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n', root=Path("/"))
    client = daemon.start(timeout=30)
    hotplug = _wait_until(lambda: (h := client.health()["hotplug"])["mode"] != "starting" and h)
    assert hotplug["active"] is True and hotplug["mode"].startswith("udev: watching"), hotplug
    assert client.request("GET", "/v1/irqs")["mode"] == "off"


def test_in_a_container_continuous_irq_balancing_only_plans(daemon_factory, host_tree):
    root = host_tree("h800-8gpu")
    (root / "run/systemd").mkdir(parents=True, exist_ok=True)
    (root / "run/systemd/container").write_text("systemd-nspawn\n")
    before = {p.name: (p / "smp_affinity_list").read_text() for p in (root / "proc/irq").iterdir() if p.name.isdigit()}
    daemon = daemon_factory(config='[irq]\nmode = "continuous"\ninterval_seconds = 0.5\n[probe]\nenabled = false\n',
                            root=root)
    client = daemon.start()
    assert _wait_until(lambda: client.health()["irq"].get("cycles", 0) >= 2)
    health = client.health()
    assert health["container"] == "systemd-nspawn" and "allow_in_container" in health["irq"]["withheld"]
    irqs = client.request("GET", "/v1/irqs")
    assert irqs["mode"] == "dry-run" and "container" in irqs["withheld"]
    after = {p.name: (p / "smp_affinity_list").read_text() for p in (root / "proc/irq").iterdir() if p.name.isdigit()}
    assert after == before, "nothing written from inside a container"
    assert "host_access" in daemon.log() and "plans IRQ affinity but writes nothing" in daemon.log()


def test_a_container_that_allows_it_does_write(daemon_factory, host_tree):
    root = host_tree("h800-8gpu")
    (root / "run/systemd").mkdir(parents=True, exist_ok=True)
    (root / "run/systemd/container").write_text("docker\n")
    daemon = daemon_factory(config='[irq]\nmode = "continuous"\nallow_in_container = true\n'
                                   '[probe]\nenabled = false\n', root=root)
    client = daemon.start()
    assert _wait_until(lambda: client.health()["irq"].get("moves_total", 0) > 0), client.health()["irq"]
    assert client.health()["irq"]["withheld"] is None


def test_a_lease_pins_cpus_by_default(scenario):
    s = scenario()
    lease = s.allocate(2)
    assert len(lease["cpus"]) == 12, "two GPUs x their node's fair share (3 cores, 6 CPUs)"
    assert all(len(p["cpus"]) == 6 for p in lease["placements"])
    gpu_cpus = lease["environment"]["TOPOD_GPU_CPUS"]
    assert all(part.split(":")[1] for part in gpu_cpus.split(";")), gpu_cpus
    s.check()


def test_every_refused_request_is_a_journal_event_with_its_reason(scenario):
    from topod.client import ApiError

    s = scenario()
    with pytest.raises(ApiError) as refused:
        s.client.allocate(9, job="too-big")
    assert refused.value.code == "insufficient_gpus"
    # The log line is rendered once the answer is out (topod.events): it follows shortly.
    assert _wait_until(lambda: "request_rejected" in s.daemon.log()), s.daemon.log()
    line = next(l for l in s.daemon.log().splitlines() if "request_rejected" in l)
    assert "code=insufficient_gpus" in line and "job=too-big" in line and "result=rejected" in line
    s.check()


def test_a_grant_is_a_log_line_that_keeps_its_decision_level(scenario):
    """lease_granted carries the decision's level; the log's own `level` (info) must not
    overwrite it: it is logged as event_level."""
    s = scenario()
    lease = s.allocate(1)
    assert _wait_until(lambda: "lease_granted" in s.daemon.log()), s.daemon.log()
    line = next(l for l in s.daemon.log().splitlines() if "lease_granted" in l)
    assert f"event_level={lease['decision']['level']}" in line and f"lease={lease['id']}" in line, line
    s.check()


def test_a_killed_irq_worker_is_replaced_with_the_topology_and_health_stays_ok(scenario):
    s = scenario(config='[irq]\nmode = "dry-run"\ninterval_seconds = 0.5\n' + live_profile())
    for kill in range(3):
        worker = _wait_until(lambda: s.client.health()["irq"]["worker"]["pid"])
        assert worker and worker != s.daemon.process.pid
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        replaced = _wait_until(lambda: (w := s.client.health()["irq"]["worker"])["starts"] >= kill + 2 and w["pid"],
                               timeout=15)
        assert replaced and replaced != worker
        degraded = []
        while time.monotonic() - killed < 2.0:  # the replacement's cycles run on the topology at once
            health = s.client.health()
            if health["status"] != "ok":
                degraded.append(health["degraded"])
            time.sleep(0.05)
        assert not degraded, degraded
        assert s.client.health()["irq"]["cycles"] >= 1, "the replacement's own cycles (it counts from 0)"
    log = s.daemon.log()
    assert "no topology" not in log, log[-3000:]
    assert "loop_failed" not in log, "a worker that dies is replaced, not a failing loop"
    replaced_lines = [line for line in log.splitlines() if "irq_worker_replaced" in line]
    assert len(replaced_lines) == 3 and "signal 9" in replaced_lines[0], replaced_lines
    s.check()


def test_the_irq_worker_goes_with_the_daemon(scenario):
    import psutil

    s = scenario(config='[irq]\nmode = "dry-run"\n[probe]\nenabled = false\n')
    worker = _wait_until(lambda: s.client.health()["irq"]["worker"]["pid"])
    s.daemon.stop(signal.SIGKILL)  # even a kill -9: the worker reads EOF and exits
    assert _wait_until(lambda: not psutil.pid_exists(worker) or
                       psutil.Process(worker).status() == psutil.STATUS_ZOMBIE, timeout=10)


def test_an_nvl72_tray_shows_its_nvlink_domain_in_the_api_and_metrics(daemon_factory):
    daemon = daemon_factory("gb200-nvl72-tray0", config=None)
    client = daemon.start()
    domain = client.topology()["nvlink_domain"]
    assert domain and domain["cluster_uuid"] and domain["clique_ids"]
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(daemon.socket)
    raw.sendall(b"GET /metrics HTTP/1.1\r\nHost: topod\r\nConnection: close\r\n\r\n")
    text = b""
    while chunk := raw.recv(65536):
        text += chunk
    raw.close()
    line = next(l for l in text.decode().splitlines() if l.startswith("topod_nvlink_domain_info"))
    assert domain["cluster_uuid"] in line and f'clique_id="{domain["clique_ids"][0]}"' in line


def test_the_readmes_telemetry_example_is_taken_on_the_default_backend(scenario):
    s = scenario()
    # the probe's setup may still run after READY: it says "starting" (503) meanwhile
    assert _wait_until(lambda: not s.client.request("GET", "/v1/links").get("starting"))
    answer = s.client.request("POST", "/v1/telemetry", {"link": "p2p/gpu0/gpu1", "bytes": 268435456,
                                                        "seconds": 0.011})
    assert answer["folded"] is True and answer["bandwidth_gbps"] > 20
    links = s.client.request("GET", "/v1/links")
    assert any("p2p" in str(row.get("link")) for row in links["links"])
    s.check()


def test_reserved_cpus_per_node_keeps_each_nodes_first_cores_out_of_leases(daemon_factory):
    daemon = daemon_factory(config='[alloc]\nreserved_cpus_per_node = 2\n[probe]\nenabled = false\n')
    client = daemon.start()
    topology = client.topology()
    first = {cpu for node in topology["numa_nodes"] for cpu in sorted(node["cpus"])[:2]}
    siblings = {s for cpu in topology["cpus"] if cpu["id"] in first for s in cpu["siblings"]}
    held = {cpu for lease in [client.allocate(4), client.allocate(4)] for cpu in lease["cpus"]}
    assert held and not held & (first | siblings), sorted(held & (first | siblings))


def test_live_profile_metrics_answer_while_links_are_probed(scenario):
    s = scenario(host="pcie-8gpu", config=live_profile())
    links = _wait_until(lambda: (a := s.client.request("GET", "/v1/links"))["enabled"] and
                        any(row["measured_gbps"] for row in a["links"]) and a, timeout=20)
    assert links, s.client.request("GET", "/v1/links")
    text = check_metrics(s.daemon.socket)
    assert "topod_link_bandwidth_bytes_per_second{" in text, text[-2000:]
    assert "topod_probe_duration_seconds" in text
    s.check()


def test_a_stalled_loop_is_logged_once_with_how_long_and_where(scenario):
    """The IRQ worker stopped (SIGSTOP) mid-call: the irq loop stops beating without
    failing. Past its deadline (3 intervals + 30 s) one loop_stalled names it, the time
    and the await it hangs in; after SIGCONT the loop beats again and health is ok."""
    s = scenario(config='[irq]\nmode = "dry-run"\ninterval_seconds = 0.5\n[probe]\nenabled = false\n'
                        '[watchdog]\nloop_deadline_seconds = 1.0\n')
    worker = _wait_until(lambda: s.client.health()["irq"]["worker"]["pid"])
    os.kill(worker, signal.SIGSTOP)
    try:
        stalled = _wait_until(lambda: [l for l in s.daemon.log().splitlines() if "loop_stalled" in l], timeout=60)
        assert stalled, s.client.health()["loops"]["irq"]
        time.sleep(2.0)  # the watchdog ticks on: still one line for this stall
        lines = [json.loads(l) for l in s.daemon.log().splitlines() if "loop_stalled" in l]
        assert len(lines) == 1, lines
        line = lines[0]
        # seconds is rounded to 0.1: a stall found 31.54 s after the last beat logs 31.5
        assert line["loop"] == "irq" and line["seconds"] >= line["deadline_seconds"] == 31.5, line
        assert "irq_worker.py" in line["where"] and "in _call" in line["where"], line["where"]
        assert any("stalled: irq" in status for status in s.notify.statuses())
    finally:
        os.kill(worker, signal.SIGCONT)
    assert _wait_until(lambda: s.client.health()["status"] == "ok", timeout=15), s.client.health()
    s.check()
