"""The daemon driven through failures of its own parts and of its clients: a lease database
deleted under it, a rescan that fails, a client that hangs up while waiting, an IRQ worker
killed or stopped: each survived, reported (health, systemd's STATUS=, one log line),
recovered from, with the scenario's invariants checked after every step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.service.daemon_scenario import _wait_until, live_profile, scenarios
from topod.client import ApiError


@pytest.fixture()
def scenario(daemon_factory, tmp_path):
    yield from scenarios(daemon_factory, tmp_path)


def test_a_ledger_that_cannot_be_rebuilt_refuses_changes_and_says_so_everywhere(scenario):
    """The state dir moved away and a file put at its path: the deleted ledger cannot be
    rebuilt there, so every change is refused, health is degraded with the reason,
    systemd's STATUS= names it, what was granted stays; once the path is usable again the
    ledger is rebuilt and changes go through."""
    s = scenario()
    lease = s.allocate(1)
    state = Path(s.daemon.state)
    state.rename(state.with_name("state.elsewhere"))
    state.write_text("in the way")
    with pytest.raises(ApiError) as refused:
        s.client.allocate(1)
    assert "rebuilding it failed" in str(refused.value)
    health = s.check(expect_degraded=True)
    assert health["status"] == "degraded" and any("rebuilding it failed" in reason for reason in health["degraded"])
    assert _wait_until(lambda: any("rebuilding it failed" in status for status in s.notify.statuses()), timeout=15)
    assert s.client.lease(lease["id"])["gpus"] == lease["gpus"]
    state.unlink()
    later = s.allocate(1)
    assert sorted(held["id"] for held in s.client.leases()) == sorted([lease["id"], later["id"]])
    # the confirmation refused during the outage is written once the ledger is back
    assert _wait_until(lambda: s.client.health()["status"] == "ok", timeout=15), s.client.health()["degraded"]
    assert all(held.get("confirmed", True) for held in s.client.leases())
    s.check()


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
