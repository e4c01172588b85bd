"""The API's HTTP connections against the real daemon: a grant and its release get the
API's answers and errors, and every shape of request on a connection — keep-alive across
endpoints, pipelined, sent in pieces, a malformed one — is answered in order, each
connection counted by the gate until it closes and closed once idle."""

from __future__ import annotations

import json
import socket
import time

import pytest

from raw_http import exchange, post

CONFIG = '[irq]\nmode = "off"\n[probe]\nenabled = false\n[api]\nidle_timeout_seconds = 2.0\n'
GRANT = json.dumps({"gpus": 1, "level": "any", "cpus_per_gpu": 0}).encode()


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def _responses(sock: socket.socket, count: int) -> list[tuple[int, dict, bytes]]:
    """Read `count` Content-Length framed responses from a keep-alive connection."""
    data = b""
    out = []
    while len(out) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} responses"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        out.append((int(lines[0].split()[1]), headers, data[:length]))
        data = data[length:]
    return out


def _keep_alive_post(body: bytes) -> bytes:
    return (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def _keep_alive_delete(lease_id: str) -> bytes:
    return f"DELETE /v1/leases/{lease_id} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


@pytest.fixture()
def daemon(daemon_factory):
    running = daemon_factory(config=CONFIG)
    client = running.start()
    yield running, client
    assert "Traceback" not in running.log()


def test_a_grant_and_its_release_get_the_apis_answers_and_errors(daemon):
    running, client = daemon
    status, headers, raw, _ = exchange(running.socket, post("/v1/leases", GRANT))
    assert status == 201
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers["connection"] == "close"
    lease = json.loads(raw)
    assert lease["gpus"] and lease["state"] == "active"
    assert [held["id"] for held in client.leases()] == [lease["id"]]
    # confirmed once the answer was written (a lease with neither ttl nor owner)
    assert client.lease(lease["id"])["confirmed"] is True
    request = f"DELETE /v1/leases/{lease['id']} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()
    status, headers, raw, _ = exchange(running.socket, request)
    assert (status, json.loads(raw)) == (200, {"released": lease["id"], "gpus": lease["gpus"]})
    assert client.leases() == []
    # The API's errors: an unknown lease, an invalid body, a charset JSON cannot have.
    status, headers, raw, _ = exchange(running.socket, request)
    assert status == 404 and json.loads(raw)["code"] == "lease_not_found"
    status, _, raw, _ = exchange(running.socket, post("/v1/leases", b'{"gpus": 0}'))
    assert status == 400 and json.loads(raw)["code"] == "invalid_request"
    status, _, raw, _ = exchange(running.socket, post("/v1/leases", b'{"gpus": 1}', "application/json; charset=latin-1"))
    assert status == 415 and json.loads(raw)["code"] == "unsupported_media_type"


def test_one_keep_alive_connection_serves_a_grant_its_release_and_other_endpoints(daemon):
    running, client = daemon
    with _connect(running.socket) as sock:
        sock.sendall(_keep_alive_post(GRANT))
        (status, headers, raw), = _responses(sock, 1)
        assert status == 201 and headers.get("connection", "keep-alive").lower() == "keep-alive"
        lease = json.loads(raw)
        sock.sendall(_keep_alive_delete(lease["id"]))
        (status, headers, raw), = _responses(sock, 1)
        assert status == 200 and json.loads(raw)["released"] == lease["id"]
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")
        (status, headers, raw), = _responses(sock, 1)
        assert status == 200 and json.loads(raw)["status"] in ("ok", "degraded")
    assert client.leases() == []


def test_pipelined_and_piecemeal_requests_are_all_answered_in_order(daemon):
    running, client = daemon
    with _connect(running.socket) as sock:
        sock.sendall(_keep_alive_post(GRANT) + _keep_alive_post(GRANT))  # two at once
        answers = _responses(sock, 2)
        assert [status for status, _, _ in answers] == [201, 201]
        ids = [json.loads(raw)["id"] for _, _, raw in answers]
        sock.sendall(_keep_alive_delete(ids[0]) + _keep_alive_delete(ids[1]))
        assert [status for status, _, _ in _responses(sock, 2)] == [200, 200]
    request = post("/v1/leases", GRANT)
    with _connect(running.socket) as sock:  # the head first, the body a moment later
        sock.sendall(request[:-len(GRANT)])
        time.sleep(0.2)
        sock.sendall(request[-len(GRANT):])
        (status, headers, raw), = _responses(sock, 1)
        assert status == 201
        client.release(json.loads(raw)["id"])
    assert client.leases() == []


@pytest.mark.parametrize("request_bytes, status, code", [
    (b"POST /v1/leases?x=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"gpus\": 0}",
     400, "invalid_request"),
    (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400,
     "invalid_request"),
    (b"DELETE /v1/leases/ab%63 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 404, "lease_not_found"),
    (b"PUT /v1/leases HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 405, "method_not_allowed"),
    (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 400, "invalid_request"),
])
def test_unusual_requests_get_the_apis_json_errors(daemon, request_bytes, status, code):
    running, _ = daemon
    got, headers, raw, _ = exchange(running.socket, request_bytes)
    assert (got, json.loads(raw)["code"]) == (status, code)
    assert headers["content-type"].startswith("application/json")


def test_connections_are_counted_until_they_close(daemon_factory):
    running = daemon_factory(config=CONFIG.replace("[api]\n", "[api]\nmax_connections = 3\n"
                                                              "root_reserved_connections = 0\n"))
    client = running.start()
    held = [_connect(running.socket) for _ in range(3)]  # idle, each counted
    try:
        status, _, raw, _ = exchange(running.socket, post("/v1/leases", GRANT))
        assert (status, json.loads(raw)["code"]) == (503, "too_many_connections")
        held[0].sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n")  # served, still open: still counted
        assert _responses(held[0], 1)[0][0] == 200
        status, _, _, _ = exchange(running.socket, post("/v1/leases", GRANT))
        assert status == 503
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while True:  # every count given back: a grant goes through again
        status, _, raw, _ = exchange(running.socket, post("/v1/leases", GRANT))
        if status == 201 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 201
    client.release(json.loads(raw)["id"])


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(daemon):
    running, _ = daemon
    with _connect(running.socket) as sock:
        sock.sendall(_keep_alive_post(GRANT))
        (status, _, raw), = _responses(sock, 1)
        assert status == 201
        started = time.monotonic()
        sock.settimeout(6)
        assert sock.recv(4096) == b""  # closed by the daemon
        assert 1.5 < time.monotonic() - started < 5
