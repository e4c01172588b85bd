"""A lease id names one lease and nothing else: topoctl refuses what is not an id (exit 2,
nothing sent), and the client escapes every path segment, so a query, `..` or a blank in
an id reaches the daemon as part of the id (404), never as another route."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from topod.client import ApiError, path_segment

REPO = Path(__file__).resolve().parents[2]
NO_PROBES = '[irq]\nmode = "off"\n[probe]\nenabled = false\n'


def topoctl(socket: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "--socket", socket, *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_path_segment_escapes_everything_that_could_leave_the_segment():
    assert path_segment("9436932d016188cc") == "9436932d016188cc"
    assert path_segment("ab?x=1") == "ab%3Fx%3D1"
    assert path_segment("../health") == "%2E%2E%2Fhealth"
    assert path_segment("bad id!") == "bad%20id%21"
    assert path_segment("é#") == "%C3%A9%23"


def test_topoctl_refuses_what_is_not_a_lease_id_with_usage_and_keeps_the_lease(daemon_factory):
    daemon = daemon_factory(config=NO_PROBES)
    client = daemon.start()
    lease = client.allocate(1, ttl_seconds=600)["id"]
    for command in ("release", "renew", "revoke", "scope"):
        for typed in (f"{lease}?x=1", "../health", "bad id!", f"{lease}/renew", ""):
            answer = topoctl(daemon.socket, command, typed, *(["1"] if command == "scope" else []))
            assert answer.returncode == 2, (command, typed, answer)
            assert f"not a lease id: {typed!r}" in answer.stderr, answer.stderr
            assert "Bad status line" not in answer.stderr
    assert [item["id"] for item in client.leases()] == [lease]


def test_the_client_asks_about_exactly_the_id_it_was_given(daemon_factory):
    daemon = daemon_factory(config=NO_PROBES)
    client = daemon.start()
    lease = client.allocate(1, ttl_seconds=600)["id"]
    for name in (f"{lease}?x=1", "../health", "bad id!", f"{lease}/../{lease}", "..", "%2E%2E"):
        with pytest.raises(ApiError) as refused:
            client.release(name)
        assert refused.value.status in (400, 404) and refused.value.code != "bad_response", (name, refused.value)
    assert [item["id"] for item in client.leases()] == [lease]
    with pytest.raises(ApiError) as missing:
        client.lease("bad id!")
    assert missing.value.status == 404 and "bad id!" in str(missing.value)


def test_topoctl_takes_an_upper_case_id_and_releases_that_lease(daemon_factory):
    daemon = daemon_factory(config=NO_PROBES)
    client = daemon.start()
    lease = client.allocate(1, ttl_seconds=600)["id"]
    answer = topoctl(daemon.socket, "release", lease.upper())
    assert answer.returncode == 0 and f"released {lease}" in answer.stdout, answer
    assert client.leases() == []
