"""Hostile input against the real daemon: each bad body, header or connection pattern
gets its exact status and code, changes nothing, and leaves no traceback in the log
(except the deliberate internal error, whose traceback is in the log only)."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.service.conftest import REPO, DaemonProcess
from topod.client import ApiError
from raw_http import exchange as _exchange
from raw_http import post as _post


def _strict_json(data: bytes):
    def refuse(name):
        raise ValueError(f"{name} in a response")

    return json.loads(data, parse_constant=refuse)


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: topod\r\nConnection: close\r\n\r\n".encode()


def _error(sock_path: str, request: bytes) -> tuple[int, str, str]:
    status, _, raw, _ = _exchange(sock_path, request)
    body = _strict_json(raw)
    assert set(body) <= {"code", "message", "request_id", "retryable"} and body["message"], body
    assert isinstance(body.get("retryable", False), bool)
    assert "Traceback" not in body["message"]
    return status, body["code"], body["message"]


def _leases(sock_path: str) -> list[dict]:
    status, _, raw, _ = _exchange(sock_path, _get("/v1/leases"))
    assert status == 200
    return _strict_json(raw)["leases"]  # strict: NaN/Infinity would fail here


@pytest.fixture()
def running(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[api]\nmax_body_bytes = 150000\n'
                                   '[alloc]\nmax_wait_seconds = 30.0\nrenew_max_ttl_seconds = 3600.0\n')
    client = daemon.start()
    lease = client.allocate(1, ttl_seconds=600, job="kept")
    yield daemon, client, lease
    assert client.health()["status"] in ("ok", "degraded")
    assert "Traceback" not in daemon.log()


BIG = str(10**400).encode()

HOSTILE_LEASE_BODIES = [
    # (body, content type, status, code, words in the message)
    (b'{"gpus": 1, "job": "caf\xe9"}', "application/json", 400, "invalid_json", "not UTF-8"),
    (b'{"gpus": 1}', "application/json; charset=x-no-such-charset", 415, "unsupported_media_type", "charset"),
    ('{"gpus": 1}'.encode("utf-16"), "application/json; charset=utf-16", 415, "unsupported_media_type", "utf-16"),
    ('{"gpus": 1}'.encode("utf-16"), "application/json", 400, "invalid_json", "not UTF-8"),
    (b"[" * 100000, "application/json", 400, "invalid_json", "deep"),
    (b'{"gpus": 1, "ttl_seconds": ' + BIG + b"}", "application/json", 400, "invalid_request", "ttl_seconds"),
    (b'{"gpus": 1, "wait": ' + BIG + b"}", "application/json", 400, "invalid_request", "wait"),
    (b'{"gpus": 1, "owner_pid": 4294967296}', "application/json", 400, "invalid_request", "owner_pid"),
    (b'{"gpus": 1, "owner_pid": ' + str(10**100).encode() + b"}", "application/json", 400, "invalid_request",
     "owner_pid"),
    (b'{"gpus": 1, "ttl_seconds": NaN}', "application/json", 400, "invalid_json", "NaN"),
    (b'{"gpus": 1, "ttl_seconds": Infinity}', "application/json", 400, "invalid_json", "Infinity"),
    (b'{"gpus": 1, "ttl_seconds": -Infinity}', "application/json", 400, "invalid_json", "Infinity"),
    (b'{"gpus": 1, "ttl_seconds": 1e400}', "application/json", 400, "invalid_request", "ttl_seconds"),
    (b'{"gpus": 1, "wait": NaN}', "application/json", 400, "invalid_json", "NaN"),
    (b'{"gpus": 1, "job": "\\ud800"}', "application/json", 400, "invalid_request", "job"),
    (b'{"gpus": 1, "job": "a\\u0000b"}', "application/json", 400, "invalid_request", "job"),
    (b'{"gpus": 1, "job": "a\\u0085b"}', "application/json", 400, "invalid_request", "job"),
    (b'{"gpus": 1, "model": ""}', "application/json", 400, "invalid_request", "model"),
    (b'{"gpus": 1, "ttl_seconds": 3601}', "application/json", 400, "invalid_request", "renew_max_ttl_seconds"),
    (b'{"gpus": 1, "wait": 31}', "application/json", 400, "invalid_request", "max_wait_seconds"),
    (b'{"gpus": 1, "job": "' + b"x" * 160000 + b'"}', "application/json", 413, "payload_too_large",
     "max_body_bytes"),
]


@pytest.mark.parametrize("body, content_type, status, code, words", HOSTILE_LEASE_BODIES,
                         ids=[f"{i}-{c[3]}" for i, c in enumerate(HOSTILE_LEASE_BODIES)])
def test_hostile_lease_body_gets_its_exact_error_and_changes_nothing(running, body, content_type, status, code,
                                                                     words):
    daemon, client, lease = running
    before = _leases(daemon.socket)
    got = _error(daemon.socket, _post("/v1/leases", body, content_type))
    assert got[:2] == (status, code), got
    assert words in got[2], got
    assert _leases(daemon.socket) == before


def test_chunked_body_over_the_limit_is_413(running):
    daemon, client, lease = running
    chunk = b"x" * 80000
    request = (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               + (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * 2 + b"0\r\n\r\n")
    assert _error(daemon.socket, request)[:2] == (413, "payload_too_large")


@pytest.mark.parametrize("body, status, code, words", [
    (b'{"ttl_seconds": ' + BIG + b"}", 400, "invalid_request", "ttl_seconds"),
    (b'{"ttl_seconds": NaN}', 400, "invalid_json", "NaN"),
    (b'{"ttl_seconds": Infinity}', 400, "invalid_json", "Infinity"),
    (b'{"ttl_seconds": 1e400}', 400, "invalid_request", "ttl_seconds"),
    (b'{"ttl_seconds": 3601}', 400, "invalid_request", "renew_max_ttl_seconds"),
    (b'{"ttl_seconds": 0}', 400, "invalid_request", "ttl_seconds"),
    (b'{"ttl": 5}', 400, "invalid_request", "ttl"),
    (b"[5]", 400, "invalid_request", "object"),
    (b"\xff\xfe", 400, "invalid_json", "UTF-8"),
])
def test_hostile_renew_body_is_refused_and_the_lease_keeps_its_expiry(running, body, status, code, words):
    daemon, client, lease = running
    before = _leases(daemon.socket)
    got = _error(daemon.socket, _post(f"/v1/leases/{lease['id']}/renew", body))
    assert got[:2] == (status, code), got
    assert words in got[2], got
    assert _leases(daemon.socket) == before


def test_renew_with_an_empty_body_keeps_the_lease_ttl_and_a_bom_is_accepted(running):
    daemon, client, lease = running
    status, _, raw, _ = _exchange(daemon.socket, _post(f"/v1/leases/{lease['id']}/renew", b""))
    assert status == 200 and _strict_json(raw)["ttl_seconds"] == 600
    status, _, raw, _ = _exchange(daemon.socket, _post(f"/v1/leases/{lease['id']}/renew",
                                                       b'\xef\xbb\xbf{"ttl_seconds": 60}'))
    assert status == 200 and _strict_json(raw)["ttl_seconds"] == 60


def test_hostile_telemetry_body_is_refused(running):
    daemon, client, lease = running
    assert _error(daemon.socket, _post("/v1/telemetry", b'{"link": "x", "bytes": 1, "seconds": NaN}'))[:2] == \
        (400, "invalid_json")
    assert _error(daemon.socket, _post("/v1/telemetry", b"{" * 5000))[:2] == (400, "invalid_json")


@pytest.mark.parametrize("method, suffix", [("GET", ""), ("DELETE", ""), ("POST", "/renew"), ("POST", "/revoke")])
def test_an_unknown_lease_id_with_control_characters_is_echoed_escaped(running, method, suffix):
    """The id comes back in the message (topoctl prints it on a terminal): escaped, so an
    ESC sequence or a NUL in a path cannot reach the terminal or a log line raw."""
    daemon, client, lease = running
    request = (f"{method} /v1/leases/%1b%5b31mred%00x{suffix} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n"
               "Connection: close\r\n\r\n").encode()
    status, code, message = _error(daemon.socket, request)
    assert (status, code) == (404, "lease_not_found")
    assert message == "no lease '\\x1b[31mred\\x00x'" and message.isprintable()


def test_wrong_method_is_405_with_an_allow_header(running):
    daemon, client, lease = running
    status, headers, raw, _ = _exchange(daemon.socket, b"PUT /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n"
                                                       b"Connection: close\r\n\r\n")
    assert (status, _strict_json(raw)["code"]) == (405, "method_not_allowed")
    assert set(headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


MALFORMED_HTTP = [
    # (raw request, words in aiohttp's reason, which the message carries on one line)
    (b"GET /v1/" + b"a" * 10000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", "8190 bytes"),
    (b"GET /v1/health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", "8190 bytes"),
    (b"GET /v1/health HTTP/1.1\r\nHost: t\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", "Too many headers"),
    (b"GARBAGE\r\n\r\n", "Invalid method"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 50, "HTTPS"),
    (b"GET /v1/health HTTP/9.9\r\n\r\n", "HTTP version"),
    (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\nabc\r\n0\r\n\r\n",
     "chunk size"),
    (b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nabcdefg",
     "Content-Length"),
]


def test_requests_that_are_not_http_get_a_json_400_and_one_log_line_not_a_traceback_each(running):
    """aiohttp's own answer is text/plain and a traceback in the log per request: a client
    could grow the journal by ~10 lines a request. Each gets the API's error instead, the
    connection is closed, nothing changes, and a flood is one log line per 10 s."""
    daemon, client, lease = running
    before = _leases(daemon.socket)
    for request, words in MALFORMED_HTTP * 2:
        status, headers, raw, _ = _exchange(daemon.socket, request)
        body = _strict_json(raw)
        assert (status, body["code"]) == (400, "invalid_request"), body
        assert body["message"].startswith("malformed HTTP request: ") and words in body["message"], body
        assert "\n" not in body["message"] and len(body["message"]) < 260
        assert headers["content-type"].startswith("application/json")  # and _exchange read to EOF: closed
    assert _leases(daemon.socket) == before
    logged = [json.loads(line) for line in daemon.log().splitlines() if '"http_request_malformed"' in line]
    assert len(logged) == 1 and logged[0]["malformed_total"] == 1 and logged[0]["level"] == "warning"
    assert "8190 bytes" in logged[0]["reason"]
    assert "Error handling request" not in daemon.log()


def test_a_server_fault_is_500_internal_error_with_a_request_id_and_the_traceback_only_in_the_log(
        host_tree, tmp_path):
    daemon = DaemonProcess(host_tree("h800-8gpu"), tmp_path, '[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("NOTIFY_SOCKET", None)
    launcher = ("import sys, topod.service.daemon as d\n"
                "def boom(self):\n    raise RuntimeError('deliberate fault for the test')\n"
                "d.Daemon.irq_report = boom\n"
                "from topod.service.main import main\nsys.exit(main(sys.argv[1:]))\n")
    with open(daemon.log_path, "ab") as log:
        daemon.process = subprocess.Popen(
            [sys.executable, "-c", launcher, "--root", str(daemon.root), "--socket", daemon.socket,
             "--state-dir", daemon.state, "--config", str(daemon.config_path), "--log-format", "json"],
            stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(daemon.socket):
            assert time.monotonic() < deadline and daemon.process.poll() is None, daemon.log()
            time.sleep(0.05)
        time.sleep(0.2)
        status, _, raw, text = _exchange(daemon.socket, _get("/v1/irqs"))
        body = _strict_json(raw)
        assert (status, body["code"]) == (500, "internal_error")
        assert len(body["request_id"]) >= 8 and body["request_id"] in body["message"]
        assert "Traceback" not in text and "deliberate" not in text
        _exchange(daemon.socket, _get("/v1/health"))  # still serving
        logged = [json.loads(line) for line in daemon.log().splitlines() if '"request_failed"' in line]
        assert logged and logged[0]["request_id"] == body["request_id"]
        assert "Traceback" in logged[0]["traceback"] and "deliberate fault" in logged[0]["traceback"]
    finally:
        daemon.stop(signal.SIGKILL)


# -- connections -----------------------------------------------------------------------

def _open(sock_path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(sock_path)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connections_beyond_max_connections_get_503_and_the_daemon_keeps_serving(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n[api]\nmax_connections = 4\n')
    client = daemon.start()
    time.sleep(0.3)  # the start-up health probe's connection is gone
    held = [_open(daemon.socket) for _ in range(4)]
    try:
        time.sleep(0.3)
        status, headers, raw, _ = _exchange(daemon.socket, _get("/v1/health"))
        assert (status, _strict_json(raw)["code"]) == (503, "too_many_connections")
        assert headers["connection"] == "close"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert client.health()["gpus"] == 8
    assert "Traceback" not in daemon.log()


def test_silent_and_half_sent_connections_are_closed_after_the_idle_timeout(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[api]\nidle_timeout_seconds = 1.0\n')
    client = daemon.start()
    silent = _open(daemon.socket)
    half = _open(daemon.socket)
    half.sendall(b"GET /v1/health HTTP/1.1\r\nHost: t\r\n")  # headers never finished
    started = time.monotonic()
    assert _closed_within(silent, 6.0) and _closed_within(half, 6.0)
    assert time.monotonic() - started < 6.0
    assert client.health()["gpus"] == 8
    silent.close()
    half.close()


def _read_to_eof(sock: socket.socket, limit: float) -> bytes:
    sock.settimeout(limit)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_body_that_stalls_gets_408_and_a_closed_connection_and_a_slow_one_is_served(daemon_factory):
    """aiohttp's idle timer stops once the headers are complete: without a limit of its
    own a client that sends half a body and stops holds a connection and a handler for
    ever, and max_connections of them lock everyone out."""
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[api]\nidle_timeout_seconds = 1.0\n')
    client = daemon.start()
    head = b"POST /v1/leases HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    stalls = {
        "content-length": head + b"Content-Length: 1000\r\n\r\n" + b'{"gpus":',
        "chunked": head + b"Transfer-Encoding: chunked\r\n\r\n8\r\n" + b'{"gpus":' + b"\r\n",
    }
    for name, request in stalls.items():
        sock = _open(daemon.socket)
        sock.sendall(request)
        started = time.monotonic()
        data = _read_to_eof(sock, 8.0)  # EOF: the daemon closed it (aiohttp's linger would be 10 s)
        waited = time.monotonic() - started
        sock.close()
        head_part, _, raw = data.partition(b"\r\n\r\n")
        body = _strict_json(raw)
        assert head_part.split()[1] == b"408" and body["code"] == "request_timeout", (name, data)
        assert "8 of 1000 bytes" in body["message"] if name == "content-length" else "8 bytes" in body["message"]
        assert "idle_timeout_seconds" in body["message"]
        assert 0.9 <= waited < 4.0, (name, waited)
    assert client.leases() == []
    # a body that trickles in, a byte every 0.4 s for longer than the idle timeout, is served
    sock = _open(daemon.socket)
    payload = b'{"gpus": 1}'
    sock.sendall(head + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode())
    for byte in payload:
        time.sleep(0.4)
        sock.sendall(bytes([byte]))
    data = _read_to_eof(sock, 8.0)
    sock.close()
    assert data.split()[1] == b"201", data
    assert len(client.leases()) == 1
    assert "Traceback" not in daemon.log()


def test_a_queued_wait_outlives_the_idle_timeout(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[api]\nidle_timeout_seconds = 0.5\n')
    client = daemon.start()
    started = time.monotonic()
    status, _, raw, _ = _exchange(daemon.socket, _post("/v1/leases", b'{"gpus": 9, "level": "any", "wait": 2}'))
    # 9 of 8 GPUs can never fit: refused at once, not cut off by the idle timer
    assert status == 409 and time.monotonic() - started < 2.5
    held = client.allocate(8, level="any")
    started = time.monotonic()
    status, _, raw, _ = _exchange(daemon.socket, _post("/v1/leases", b'{"gpus": 1, "wait": 1.5}'))
    assert (status, _strict_json(raw)["code"]) == (409, "wait_timeout"), raw
    assert time.monotonic() - started >= 1.4
    client.release(held["id"])


def test_descriptor_exhaustion_neither_crashes_nor_floods_the_log(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n'
                                   '[api]\nmax_connections = 100000\n')
    real_popen = subprocess.Popen

    def limited(*args, **kwargs):
        kwargs["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))
        return real_popen(*args, **kwargs)

    subprocess.Popen = limited
    try:
        client = daemon.start()
    finally:
        subprocess.Popen = real_popen
    held: list[socket.socket] = []
    try:
        for _ in range(400):
            try:
                held.append(_open(daemon.socket))
            except OSError:
                break  # the listen backlog is full: what a client sees under a flood
        time.sleep(2.5)  # asyncio retries accept() once a second
        assert daemon.process.poll() is None, daemon.log()[-3000:]
    finally:
        for sock in held:
            sock.close()
    # The backlog the flood left is accepted (and closed, its clients gone) in bursts, one
    # a second after EMFILE; meanwhile a client may get 503 "retry shortly". It is served
    # within a few seconds, and the daemon never died.
    deadline = time.monotonic() + 15
    while True:
        try:
            assert client.health()["gpus"] == 8
            break
        except ApiError as exc:
            assert exc.code == "too_many_connections" and time.monotonic() < deadline, exc
            time.sleep(0.25)
    log = daemon.log()
    assert "Traceback" not in log
    assert log.count('"accept_failed"') <= 5
    assert log.count('"connection_refused"') <= 3
    assert "max_connections_lowered" in log


def test_a_nan_in_a_stored_lease_is_answered_as_null(daemon_factory):
    # an older state file (or a bug) left NaN in a lease row: the row reads back, and every
    # answer that carries the lease stays strict JSON, the value null
    import sqlite3

    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    lease = daemon.start().allocate(1, job="nan")
    assert daemon.stop() == 0
    db = sqlite3.connect(Path(daemon.state) / "leases.sqlite3")
    body = json.loads(db.execute("SELECT body FROM leases WHERE id = ?", (lease["id"],)).fetchone()[0])
    body["decision"]["satisfaction"] = float("nan")
    db.execute("UPDATE leases SET body = ? WHERE id = ?", (json.dumps(body), lease["id"]))
    db.commit()
    db.close()
    daemon.start()
    [listed] = _leases(daemon.socket)
    status, _, raw, _ = _exchange(daemon.socket, _get(f"/v1/leases/{lease['id']}"))
    assert status == 200
    for answer in (listed, _strict_json(raw)):
        assert answer["id"] == lease["id"] and answer["decision"]["satisfaction"] is None
