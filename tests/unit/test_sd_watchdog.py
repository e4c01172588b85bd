"""The loop supervisor (pure) and the watchdog task over a real notify socket."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import socket
import tempfile

import pytest

from topod.service.notify import Notifier
from topod.service.watchdog import Supervisor, run_watchdog, watchdog_interval, watchdog_tick


# -- Supervisor --------------------------------------------------------------------------
def test_healthy_only_while_every_loop_beats_within_its_deadline():
    sup = Supervisor()
    sup.register("irq", 30.0, now=100.0)
    sup.register("api", 10.0, now=100.0)
    assert sup.healthy(now=109.0)
    assert sup.stalled(now=111.0) == ["api"]
    sup.beat("api", now=111.0)
    assert sup.healthy(now=120.0)
    sup.beat("api", now=125.0)
    assert sup.stalled(now=131.0) == ["irq"]
    assert not sup.healthy(now=131.0)


def test_a_loop_exactly_at_its_deadline_still_counts_as_healthy():
    sup = Supervisor()
    sup.register("probe", 5.0, now=0.0)
    assert sup.healthy(now=5.0)
    assert not sup.healthy(now=5.001)


def test_registering_again_restarts_the_clock_and_replaces_the_deadline():
    sup = Supervisor()
    sup.register("rescan", 5.0, now=0.0)
    sup.register("rescan", 60.0, now=50.0)
    assert sup.healthy(now=100.0)
    assert sup.report(now=100.0)["rescan"]["deadline_seconds"] == 60.0


def test_an_unregistered_loop_no_longer_blocks_the_watchdog():
    sup = Supervisor()
    sup.register("probe", 1.0, now=0.0)
    sup.unregister("probe")
    sup.unregister("never-there")
    assert sup.healthy(now=1000.0)


def test_no_registered_loops_is_healthy():
    assert Supervisor().healthy(now=0.0)


def test_beat_of_an_unknown_loop_names_the_registered_ones():
    sup = Supervisor()
    sup.register("irq", 1.0, now=0.0)
    with pytest.raises(KeyError, match=r"'probe' beat before register\(\); registered: \['irq'\]"):
        sup.beat("probe")


@pytest.mark.parametrize("deadline", [0, -1.0, math.nan])
def test_a_deadline_must_be_positive(deadline):
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        Supervisor().register("irq", deadline)


def test_a_loop_needs_a_name():
    with pytest.raises(ValueError, match="needs a name"):
        Supervisor().register("", 1.0)


def test_report_is_json_ready_per_loop():
    sup = Supervisor()
    sup.register("irq", 30.0, now=10.0)
    sup.register("api", 5.0, now=10.0)
    assert sup.report(now=17.5) == {
        "api": {"deadline_seconds": 5.0, "seconds_since_beat": 7.5, "healthy": False, "stalled": True,
                "failures": 0, "failing": False, "last_error": None},
        "irq": {"deadline_seconds": 30.0, "seconds_since_beat": 7.5, "healthy": True, "stalled": False,
                "failures": 0, "failing": False, "last_error": None},
    }


def test_stalled_text_names_loops_and_deadlines_but_not_ages():
    sup = Supervisor()
    sup.register("probe", 240.0, now=0.0)
    sup.register("irq", 60.0, now=0.0)
    assert sup.stalled_text(now=10.0) is None
    assert sup.stalled_text(now=61.0) == "stalled: irq (deadline 60s)"
    assert sup.stalled_text(now=300.0) == sup.stalled_text(now=400.0) == \
        "stalled: irq (deadline 60s), probe (deadline 240s)"


def test_the_supervisor_clock_is_used_when_no_time_is_given():
    now = [0.0]
    sup = Supervisor(clock=lambda: now[0])
    sup.register("irq", 10.0)
    now[0] = 11.0
    assert sup.stalled() == ["irq"]


def test_tick_pings_only_when_healthy_and_pinging():
    sup = Supervisor()
    sup.register("irq", 10.0, now=0.0)
    assert watchdog_tick(sup, 5.0, True, "ok").ping is True
    assert watchdog_tick(sup, 5.0, False, "ok").ping is False
    stalled = watchdog_tick(sup, 20.0, True, "ok")
    assert (stalled.ping, stalled.status) == (False, "stalled: irq (deadline 10s)")


# -- watchdog_interval -------------------------------------------------------------------
def test_interval_is_half_of_watchdog_usec():
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0


def test_interval_for_our_pid_only():
    env = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval(env) == 15.0
    assert watchdog_interval(env, pid=os.getpid() + 1) is None


def test_no_interval_without_watchdog_usec():
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": ""}) is None
    assert watchdog_interval({"WATCHDOG_PID": str(os.getpid())}) is None


@pytest.mark.parametrize(("env", "message"), [
    ({"WATCHDOG_USEC": "30s"}, "WATCHDOG_USEC='30s' is not a whole number"),
    ({"WATCHDOG_USEC": "0"}, "WATCHDOG_USEC='0' must be > 0"),
    ({"WATCHDOG_USEC": "-5"}, "WATCHDOG_USEC='-5' must be > 0"),
    ({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "me"}, "WATCHDOG_PID='me' is not a process id"),
])
def test_malformed_watchdog_variables_are_named(env, message):
    with pytest.raises(ValueError, match=message):
        watchdog_interval(env)


# -- run_watchdog over a real socket ------------------------------------------------------
@pytest.fixture()
def systemd_socket():
    directory = tempfile.mkdtemp(prefix="sdw", dir="/tmp")
    path = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield path, sock
    sock.close()
    shutil.rmtree(directory, ignore_errors=True)


def _drain(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(65536).decode())
        except BlockingIOError:
            return messages


def test_watchdog_pings_stop_when_a_loop_stalls_and_resume_when_it_beats(systemd_socket):
    path, sock = systemd_socket
    now = [0.0]
    sup = Supervisor(clock=lambda: now[0])
    sup.register("irq", 10.0)
    sup.register("api", 10.0)

    async def scenario() -> list[list[str]]:
        task = asyncio.create_task(run_watchdog(Notifier({"NOTIFY_SOCKET": path}), sup, 0.01,
                                                status_text=lambda: "2 lease(s)"))
        phases = []
        await asyncio.sleep(0.08)          # both loops fresh
        phases.append(_drain(sock))
        now[0] = 11.0                      # irq stops beating, api goes on
        sup.beat("api")
        await asyncio.sleep(0.08)
        phases.append(_drain(sock))
        sup.beat("irq")                    # irq recovers
        await asyncio.sleep(0.08)
        phases.append(_drain(sock))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return phases

    healthy, stalled, recovered = asyncio.run(scenario())
    assert healthy.count("WATCHDOG=1") >= 3
    assert healthy.count("STATUS=2 lease(s)") == 1, "STATUS is sent once, not every tick"
    assert "WATCHDOG=1" not in stalled
    assert stalled == ["STATUS=stalled: irq (deadline 10s)"]
    assert recovered[0] == "WATCHDOG=1" and "STATUS=2 lease(s)" in recovered
    assert recovered.count("WATCHDOG=1") >= 3


def test_without_a_watchdog_interval_no_pings_but_stalls_are_reported(systemd_socket):
    path, sock = systemd_socket
    sup = Supervisor(clock=lambda: 100.0)
    sup.register("probe", 5.0, now=0.0)

    async def scenario() -> list[str]:
        task = asyncio.create_task(run_watchdog(Notifier({"NOTIFY_SOCKET": path}), sup, None, idle_interval=0.01))
        await asyncio.sleep(0.05)
        task.cancel()
        return _drain(sock)

    assert asyncio.run(scenario()) == ["STATUS=stalled: probe (deadline 5s)"]


def test_run_watchdog_rejects_a_non_positive_interval():
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        asyncio.run(run_watchdog(Notifier({}), Supervisor(), 0.0))
