"""A client that sends its whole request, then shutdown(SHUT_WR) and reads, is answered
(sent at once or in pieces, HTTP/1.0 and 1.1), its grant stays granted, and the
connection closes after the answer. A real hang-up — the peer closed, or
stopped before its request was whole — still withdraws a waiting request and leaves no
lease behind."""

from __future__ import annotations

import json
import socket
import time

import pytest

CONFIG = '[irq]\nmode = "off"\n[probe]\nenabled = false\n[api]\nidle_timeout_seconds = 30.0\n'
ROUNDS = 20  # the half-closed grant went unanswered about 1 time in 4 before: 20 rounds catch it


@pytest.fixture()
def daemon(daemon_factory):
    running = daemon_factory(config=CONFIG)
    client = running.start()
    yield running, client
    assert "Traceback" not in running.log()


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything until the server closes; a server that never closes fails the test
    (socket.timeout) rather than hanging it."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _half_closed(path: str, *parts: bytes, pause: float = 0.0) -> tuple[int, dict, bytes]:
    """Send `parts` (with `pause` between them), shut down the sending side, read the
    answer until the server closes: (status, headers, body)."""
    with _connect(path) as sock:
        for index, part in enumerate(parts):
            if index and pause:
                time.sleep(pause)
            sock.sendall(part)
        sock.shutdown(socket.SHUT_WR)
        data = _read_to_eof(sock)
    assert data, "the half-closed client got no answer"
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert len(body) == int(headers["content-length"]), "the whole body, then the close"
    return int(lines[0].split()[1]), headers, body


def _answers(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each Content-Length framed answer in `data`, in order."""
    out = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        out.append((int(lines[0].split()[1]), data[:length]))
        data = data[length:]
    return out


def _get(path: str, version: str) -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: t\r\n\r\n".encode()


def _post_head(version: str, body: bytes) -> bytes:
    return (f"POST /v1/leases HTTP/{version}\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()


def _grant_body(gpus: int = 1, **fields: object) -> bytes:
    return json.dumps({"gpus": gpus, "level": "any", "cpus_per_gpu": 0, **fields}).encode()


def _delete(lease_id: str, version: str) -> bytes:
    return f"DELETE /v1/leases/{lease_id} HTTP/{version}\r\nHost: t\r\n\r\n".encode()


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("path", ["/v1/health", "/v1/topology"])
def test_a_half_closed_get_is_answered_and_the_connection_closed(daemon, path, version):
    running, client = daemon
    for _ in range(5):
        status, headers, body = _half_closed(running.socket, _get(path, version))
        assert status == 200
        assert headers.get("connection", "close").lower() == "close"
        document = json.loads(body)
        assert ("status" in document) if path == "/v1/health" else ("gpus" in document)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_a_half_closed_grant_is_answered_and_stays_granted_then_its_half_closed_release_too(daemon, version):
    running, client = daemon
    for _ in range(ROUNDS):
        body = _grant_body()
        status, headers, raw = _half_closed(running.socket, _post_head(version, body) + body)
        assert status == 201, raw
        lease = json.loads(raw)
        listed = client.leases()
        assert [held["id"] for held in listed] == [lease["id"]], "told granted: the lease exists"
        assert client.lease(lease["id"])["confirmed"] is True  # its answer counted as written
        status, _, raw = _half_closed(running.socket, _delete(lease["id"], version))
        assert (status, json.loads(raw)) == (200, {"released": lease["id"], "gpus": lease["gpus"]})
        assert client.leases() == []


def test_a_half_closed_grant_sent_in_pieces_is_answered(daemon):
    running, client = daemon
    body = _grant_body()
    status, headers, raw = _half_closed(running.socket, _post_head("1.1", body), body, pause=0.1)
    assert status == 201, raw
    lease = json.loads(raw)
    assert [held["id"] for held in client.leases()] == [lease["id"]]
    assert client.lease(lease["id"])["confirmed"] is True


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_a_half_closed_waiting_grant_is_granted_when_gpus_free_up(daemon, version):
    running, client = daemon
    holder = client.allocate(8, level="any", cpus_per_gpu=0)
    body = _grant_body(wait=20)
    with _connect(running.socket) as sock:
        sock.sendall(_post_head(version, body) + body)
        sock.shutdown(socket.SHUT_WR)
        _wait_for(lambda: client.health()["waiting"] == 1)
        time.sleep(1.5)  # a reaper pass (every second while anything waits) must not take it for gone
        assert client.health()["waiting"] == 1
        client.release(holder["id"])
        data = _read_to_eof(sock)
    assert data.split(b" ", 2)[1] == b"201", data[:200]
    lease = json.loads(data.partition(b"\r\n\r\n")[2])
    assert [held["id"] for held in client.leases()] == [lease["id"]]
    assert client.lease(lease["id"])["confirmed"] is True


def test_pipelined_requests_then_a_half_close_are_all_answered(daemon):
    running, _ = daemon
    with _connect(running.socket) as sock:
        sock.sendall(_get("/v1/health", "1.1") + _get("/v1/leases", "1.1"))
        sock.shutdown(socket.SHUT_WR)
        data = _read_to_eof(sock)
    (health_status, health), (list_status, listing) = _answers(data)
    assert (health_status, list_status) == (200, 200)
    assert json.loads(health)["status"] and json.loads(listing) == {"leases": []}


def test_a_request_pipelined_behind_a_waiting_grant_then_a_half_close_are_both_answered(daemon):
    running, client = daemon
    holder = client.allocate(8, level="any", cpus_per_gpu=0)
    body = _grant_body(wait=20)
    with _connect(running.socket) as sock:
        sock.sendall(_post_head("1.1", body) + body)
        _wait_for(lambda: client.health()["waiting"] == 1)
        sock.sendall(_get("/v1/leases", "1.1"))  # pipelined behind the grant that waits
        sock.shutdown(socket.SHUT_WR)
        time.sleep(0.3)
        client.release(holder["id"])
        data = _read_to_eof(sock)
    (grant_status, grant), (list_status, listing) = _answers(data)
    assert (grant_status, list_status) == (201, 200)
    granted = json.loads(grant)
    assert [held["id"] for held in json.loads(listing)["leases"]] == [granted["id"]]
    assert [held["id"] for held in client.leases()] == [granted["id"]]


def test_a_partial_request_behind_a_waiting_grant_then_a_half_close_gets_only_the_grants_answer(daemon):
    running, client = daemon
    holder = client.allocate(8, level="any", cpus_per_gpu=0)
    body = _grant_body(wait=20)
    with _connect(running.socket) as sock:
        sock.sendall(_post_head("1.1", body) + body)
        _wait_for(lambda: client.health()["waiting"] == 1)
        sock.sendall(_post_head("1.1", body) + body[:5])  # a second grant, cut short
        sock.shutdown(socket.SHUT_WR)
        time.sleep(0.3)
        client.release(holder["id"])
        data = _read_to_eof(sock)
    [(status, grant)] = _answers(data)
    assert status == 201
    granted = json.loads(grant)
    assert [held["id"] for held in client.leases()] == [granted["id"]], "the whole one granted, the cut one not"


def _hold_all_and_queue(running, client, sent: str = "whole") -> tuple[dict, socket.socket]:
    """All 8 GPUs held, and a grant waiting for one on its own connection: sent whole or
    head then body ("in_pieces")."""
    holder = client.allocate(8, level="any", cpus_per_gpu=0)
    body = _grant_body(wait=30)
    sock = _connect(running.socket)
    if sent == "whole":
        sock.sendall(_post_head("1.1", body) + body)
    else:
        sock.sendall(_post_head("1.1", body))
        time.sleep(0.1)
        sock.sendall(body)
    _wait_for(lambda: client.health()["waiting"] == 1)
    return holder, sock


def test_a_half_closed_waiting_grant_sent_in_pieces_is_granted_when_gpus_free_up(daemon):
    running, client = daemon
    holder, sock = _hold_all_and_queue(running, client, "in_pieces")
    with sock:
        sock.shutdown(socket.SHUT_WR)
        time.sleep(1.5)  # a reaper pass must not take it for gone
        assert client.health()["waiting"] == 1
        client.release(holder["id"])
        [(status, grant)] = _answers(_read_to_eof(sock))
    assert status == 201
    lease = json.loads(grant)
    assert [held["id"] for held in client.leases()] == [lease["id"]]
    assert client.lease(lease["id"])["confirmed"] is True


@pytest.mark.parametrize("sent", ["whole", "in_pieces"])
def test_a_client_that_closes_while_waiting_has_its_request_withdrawn(daemon, sent):
    running, client = daemon
    holder, sock = _hold_all_and_queue(running, client, sent)
    sock.close()
    _wait_for(lambda: client.health()["waiting"] == 0)
    client.release(holder["id"])
    time.sleep(0.3)
    assert client.leases() == [], "no lease for a client that hung up"
    assert client.health()["gpus_free"] == 8


@pytest.mark.parametrize("sent", ["whole", "in_pieces"])
def test_a_half_closed_client_that_then_closes_while_waiting_has_its_request_withdrawn(daemon, sent):
    running, client = daemon
    holder, sock = _hold_all_and_queue(running, client, sent)
    sock.shutdown(socket.SHUT_WR)
    time.sleep(0.3)
    assert client.health()["waiting"] == 1  # half-closed: still waiting for its answer
    sock.close()
    _wait_for(lambda: client.health()["waiting"] == 0)  # the reaper finds it gone
    client.release(holder["id"])
    time.sleep(0.3)
    assert client.leases() == [], "no lease for a client that hung up"


@pytest.mark.parametrize("sent", ["whole", "in_pieces"])
def test_a_half_closed_client_gone_when_its_grant_comes_leaves_no_lease(daemon, sent):
    running, client = daemon
    holder, sock = _hold_all_and_queue(running, client, sent)
    sock.shutdown(socket.SHUT_WR)
    time.sleep(0.3)
    sock.close()
    client.release(holder["id"])  # at once: before a reaper pass can withdraw the waiter
    _wait_for(lambda: client.health()["waiting"] == 0)
    time.sleep(0.3)
    assert client.leases() == [], "granted to no one: taken back"
    assert client.health()["gpus_free"] == 8


def test_a_half_close_before_the_whole_request_is_a_hang_up(daemon):
    running, client = daemon
    with _connect(running.socket) as sock:
        sock.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"gpus\": 1")
        sock.shutdown(socket.SHUT_WR)
        assert _read_to_eof(sock) == b""  # closed, nothing answered
    assert client.leases() == []
