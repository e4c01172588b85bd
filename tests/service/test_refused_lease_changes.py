"""Refused release / renew / revoke calls leave a journal line (`request_rejected` with
result, code, uid, pid and the lease), as refused allocations do."""

from __future__ import annotations

import json
import os
import time

import pytest

from topod.client import ApiError, Client

NOBODY = 65534


def _as_nobody(socket_path: str, method: str, path: str) -> tuple[int, dict]:
    """Call the API from a forked child that dropped to uid 65534: (its pid, the error)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                Client(socket_path).request(method, path)
                result = {"status": 200}
            except ApiError as exc:
                result = {"status": exc.status, "code": exc.code}
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return pid, json.loads(data)


def _rejections(daemon, count: int, timeout: float = 10.0) -> list[dict]:  # noqa: ANN001 - DaemonProcess
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for line in daemon.log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "request_rejected":
                found.append(record)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_unknown_lease_release_renew_revoke_are_logged_as_not_found(daemon_factory):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    for call in (lambda: client.release("nosuch1"), lambda: client.renew("nosuch2", 60),
                 lambda: client.request("POST", "/v1/leases/nosuch3/revoke")):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == 404
    records = _rejections(daemon, 3)
    assert [(r["request"], r["lease"], r["result"], r["code"]) for r in records] == [
        ("release", "nosuch1", "not_found", "lease_not_found"),
        ("renew", "nosuch2", "not_found", "lease_not_found"),
        ("revoke", "nosuch3", "not_found", "lease_not_found")]
    assert all(r["uid"] == os.getuid() and r["pid"] == os.getpid() for r in records)
    assert all(r["level"] == "warning" for r in records)
    assert "no lease 'nosuch1'" in records[0]["reason"]


def test_a_renew_without_ttl_on_a_lease_without_one_is_logged_as_invalid(daemon_factory):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    lease = client.allocate(1, job="no-ttl")
    with pytest.raises(ApiError) as refused:
        client.renew(lease["id"])
    assert refused.value.status == 400
    (record,) = _rejections(daemon, 1)
    assert (record["request"], record["result"], record["code"], record["lease"]) == (
        "renew", "invalid", "invalid_request", lease["id"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_another_users_release_renew_revoke_are_logged_as_denied(daemon_factory, public_socket):
    daemon = daemon_factory(config='[daemon]\nsocket_mode = "0666"\n[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    public_socket(daemon)
    client = daemon.start()
    lease = client.allocate(1, ttl_seconds=600)["id"]
    calls = [("release", "DELETE", f"/v1/leases/{lease}"), ("renew", "POST", f"/v1/leases/{lease}/renew"),
             ("revoke", "POST", f"/v1/leases/{lease}/revoke")]
    pids = []
    for _, method, path in calls:
        pid, answer = _as_nobody(daemon.socket, method, path)
        assert answer == {"status": 403, "code": "permission_denied"}, answer
        pids.append(pid)
    records = _rejections(daemon, 3)
    assert [(r["request"], r["result"], r["code"], r["uid"], r["pid"], r["lease"]) for r in records] == [
        (name, "denied", "permission_denied", NOBODY, pid, lease) for (name, _, _), pid in zip(calls, pids)]
    assert "belongs to uid 0" in records[0]["reason"] and "root-only" in records[2]["reason"]
    assert [item["id"] for item in client.leases()] == [lease]  # nothing changed
