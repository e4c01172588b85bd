"""`topoctl watch` as a user runs it against the real daemon: ISO 8601 times, no null
fields, and a stream that survives a daemon restart (it exited 75 there)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"


class Watch:
    """`topoctl watch ...` in a child process, its stdout lines read as they come."""

    def __init__(self, socket: str, *argv: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.process = subprocess.Popen([sys.executable, "-m", "topod.cli.topoctl", "watch", "--socket", socket,
                                         *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def next_line(self, poke, timeout: float = 20.0) -> str:  # noqa: ANN001 - callable
        """Call poke() until a line comes (the watcher subscribes a moment after it starts)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            poke()
            try:
                line = self.lines.get(timeout=0.3)
            except queue.Empty:
                continue
            self.out.append(line)
            return line
        raise AssertionError(f"no line from watch within {timeout} s; stderr: {self.stderr()}")

    def finish(self, timeout: float = 20.0, poke=None) -> tuple[int, str]:  # noqa: ANN001 - callable
        """Wait for the watcher to exit; poke() meanwhile, when given: a watcher that
        subscribed in the middle of a cycle (after its grant) waits for the next one."""
        deadline = time.monotonic() + timeout
        while poke is not None and self.process.poll() is None and time.monotonic() < deadline:
            poke()
            time.sleep(0.3)
        code = self.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        time.sleep(0.1)
        while not self.lines.empty():
            self.out.append(self.lines.get())
        return code, self.process.stderr.read()

    def stderr(self) -> str:
        if self.process.poll() is None:
            self.process.kill()
        return self.process.stderr.read()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture()
def watches():
    started: list[Watch] = []

    def make(socket: str, *argv: str) -> Watch:
        started.append(Watch(socket, *argv))
        return started[-1]

    yield make
    for watch in started:
        watch.kill()


def _cycle(client, **fields):  # noqa: ANN001, ANN202 - Client
    def poke() -> None:
        lease = client.allocate(1, **fields)
        if lease.get("expires") is not None:
            client.renew(lease["id"], 120)
        client.release(lease["id"])
    return poke


def test_watch_text_prints_iso_times_and_leaves_null_fields_out(daemon_factory, watches):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    watch = watches(daemon.socket, "--event", "lease_granted", "lease_renewed", "--count", "2")
    poke = _cycle(client, ttl_seconds=60)
    first = watch.next_line(poke)
    code, err = watch.finish(poke=poke)
    assert code == 0, err
    lines = watch.out
    assert len(lines) == 2 and first == lines[0]
    granted = next(line for line in lines if " lease_granted " in line)
    renewed = next(line for line in lines if " lease_renewed " in line)
    # lists in brackets, the CPUs too (a list, as the GPUs): never a count beside a list
    assert re.match(ISO + " lease_granted lease=\\w+ gpus=\\[\\d\\] cpus=\\[\\d+(,\\d+)*\\] uid=0 level=\\w+$",
                    granted), granted
    assert "None" not in granted and "job=" not in granted  # no job given: no field
    assert re.match(ISO + " lease_renewed lease=\\w+ expires=" + ISO + "$", renewed), renewed


def test_watch_json_keeps_the_apis_records(daemon_factory, watches):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    watch = watches(daemon.socket, "--event", "lease_renewed", "--count", "1", "--json")
    record = json.loads(watch.next_line(_cycle(client, ttl_seconds=60)))
    assert watch.finish()[0] == 0
    assert isinstance(record["expires"], float) and record["expires"] > time.time()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "kill"])
def test_watch_reconnects_across_a_daemon_restart(daemon_factory, watches, how):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    watch = watches(daemon.socket, "--event", "lease_granted", "--count", "2")
    before = watch.next_line(_cycle(client, job="before"))
    assert "job=before" in before
    daemon.stop(how)
    client = daemon.start()  # the same socket and state directory, as systemd restarts it
    after = watch.next_line(_cycle(client, job="after"))
    code, err = watch.finish()
    assert code == 0, err  # it was 75: "daemon unavailable"
    assert "job=after" in after
    assert f"topod at {daemon.socket} went away" in err and "reconnecting" in err
    assert f"reconnected to topod at {daemon.socket}" in err and "not replayed" in err


def test_watch_gives_up_with_75_when_the_daemon_stays_away(daemon_factory, watches):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    watch = watches(daemon.socket, "--event", "lease_granted", "--reconnect-timeout", "1.5")
    watch.next_line(_cycle(client))
    daemon.stop()
    started = time.monotonic()
    code, err = watch.finish(timeout=30)
    assert code == 75, err
    assert 1.0 <= time.monotonic() - started < 15
    last = err.strip().splitlines()[-1]
    assert last.startswith("topoctl: ") and "gave up reconnecting after 1.5 s" in last, err


def test_watch_without_reconnecting_exits_75_when_the_stream_ends(daemon_factory, watches):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    watch = watches(daemon.socket, "--reconnect-timeout", "0", "--json")
    watch.next_line(_cycle(client))
    daemon.stop()
    code, err = watch.finish()
    assert code == 75, err
    (error,) = [json.loads(line) for line in err.splitlines()]  # one JSON line, no notes
    assert error["code"] == "daemon_unreachable", error


def test_watch_with_no_daemon_is_75_at_once(tmp_path):
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "watch", "--socket", str(tmp_path / "no.sock")],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=30)
    assert done.returncode == 75
    assert done.stderr.splitlines() == [f"topoctl: cannot reach topod at {tmp_path / 'no.sock'}: "
                                        "No such file or directory"]


def test_watch_rejects_a_negative_reconnect_timeout(capsys):
    from topod.cli.topoctl import main

    with pytest.raises(SystemExit) as exit_info:
        main(["watch", "--reconnect-timeout", "-1"])
    assert exit_info.value.code == 2 and "--reconnect-timeout" in capsys.readouterr().err


def test_event_text_formats_deadlines_lists_and_blanks():
    from topod.cli.watch_cmd import format_event

    line = format_event({"event": "preemption_requested", "time": 1.7e9, "lease": "ab", "deadline": 1.7e9 + 300,
                         "request": "w1", "gpus": [0, 1], "uid": 0, "job": None,
                         "reason": "owner process 12 exited", "deadline_seconds": 300.0})
    assert re.fullmatch(ISO + " preemption_requested lease=ab deadline=" + ISO + " request=w1 gpus=\\[0,1\\] uid=0 "
                        'reason="owner process 12 exited" deadline_seconds=300.0', line), line
    assert "T" in line.split("deadline=")[1].split()[0]
