"""Schemathesis against the real daemon: every operation of the served OpenAPI 3.1
document, valid (positive) and invalid (negative) inputs generated from it, a fixed seed,
a bounded number of cases. No response may be a 5xx or break the document (status,
content type, schema); a valid request is never refused as malformed (400
invalid_request/invalid_json: a constraint the document does not state) and an invalid one
never accepted (a constraint the document states that the server does not enforce)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
requests = pytest.importorskip("requests")

import hypothesis  # noqa: E402
import urllib3  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from requests.adapters import HTTPAdapter  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.config._checks import NegativeDataRejectionConfig, PositiveDataAcceptanceConfig  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance, negative_data_rejection, positive_data_acceptance, response_schema_conformance,
    status_code_conformance,
)

CASES_PER_OPERATION = 100
NEGATIVE_CASES_PER_OPERATION = 50
# What a request the document allows may get besides 2xx: a lease or GPU that is not there
# (404), taken or too few (409), a full queue (429), root-only (403), a server state (5xx).
POSITIVE_STATUSES = ["2xx", "403", "404", "409", "429", "5xx"]
# What a request the document forbids must get: refused, never served nor queued (409/429
# would hide a field the server took).
NEGATIVE_STATUSES = ["400", "403", "404", "405", "413", "415", "5xx"]
# 400s a valid request may still get: facts of this host or of the moment the document
# cannot know (a GPU, link or process that is not there), and rules across fields that
# JSON Schema cannot state (each says so in the document's descriptions).
HOST_FACTS = {"unknown_gpu": ("",),
              "unknown_device": ("",),  # a lease's near naming a device or node this host has not
              "invalid_telemetry": ("unknown link", "no GPU", "two different devices", "plausible"),
              "invalid_request": ("no process", "but the request is for", "lists a GPU twice")}
SEED = 20240611
# Short waits and ttls keep generated requests from queueing for long or holding GPUs.
# The probe is on (so /v1/telemetry answers instead of 503 unavailable) but its backend
# measures this machine, which a fixture tree is not: it stays idle.
CONFIG = ('[irq]\nmode = "off"\n[probe]\nenabled = true\n'
          '[alloc]\nmax_wait_seconds = 0.2\nrenew_max_ttl_seconds = 5.0\n')


class _UnixConnection(urllib3.connection.HTTPConnection):
    socket_path = ""

    def _new_conn(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout if isinstance(self.timeout, (int, float)) else 10.0)
        sock.connect(self.socket_path)
        return sock


class UnixAdapter(HTTPAdapter):
    """requests over AF_UNIX: any http:// URL goes to the daemon's socket."""

    def __init__(self, socket_path: str) -> None:
        super().__init__()
        connection = type("Connection", (_UnixConnection,), {"socket_path": socket_path})
        self.pool = urllib3.HTTPConnectionPool("topod", maxsize=1)
        self.pool.ConnectionCls = connection

    def get_connection_with_tls_context(self, request, verify, proxies=None, cert=None):  # requests >= 2.32
        return self.pool

    def get_connection(self, url, proxies=None):  # older requests
        return self.pool

    def close(self) -> None:
        self.pool.close()
        super().close()


@pytest.fixture()
def daemon_session(daemon_factory):
    daemon = daemon_factory(config=CONFIG)
    daemon.start()
    session = requests.Session()
    session.mount("http://", UnixAdapter(daemon.socket))
    yield daemon, session
    session.close()


def test_every_operation_answers_per_the_document_without_server_errors(daemon_session):
    daemon, session = daemon_session
    document = session.get("http://topod/v1/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(expected_statuses=POSITIVE_STATUSES)
    schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(expected_statuses=NEGATIVE_STATUSES)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
              positive_data_acceptance, negative_data_rejection]
    started = time.monotonic()
    counts: dict[str, int] = {}
    statuses: dict[str, set[int]] = {}
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        if operation.path == "/v1/events":
            continue  # a stream that never ends; tests/service cover it with a short read

        for mode, cases in ((GenerationMode.POSITIVE, CASES_PER_OPERATION),
                            (GenerationMode.NEGATIVE, NEGATIVE_CASES_PER_OPERATION)):
            try:
                strategy = operation.as_strategy(generation_mode=mode)
            except Exception:  # noqa: BLE001 - an operation with nothing to negate (no parameters, no body)
                continue

            key = f"{label} ({mode.value})"

            def call(case, key=key, positive=mode.is_positive) -> None:
                response = case.call(base_url="http://topod", session=session, timeout=10)
                counts[key] = counts.get(key, 0) + 1
                statuses.setdefault(key, set()).add(response.status_code)
                if positive and response.status_code == 400 and _host_fact(response):
                    return  # e.g. must_include naming GPU 4000: valid, but not on this host
                try:
                    case.validate_response(response, checks=checks)
                except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collect, report all at the end
                    failures.append(f"{key} {response.status_code} {_code(response)} body={case.body!r:.300}: "
                                    f"{str(exc)[:600]}")

            try:
                _runner(call, strategy, cases)()
            except hypothesis.errors.Unsatisfiable:
                continue  # nothing negative to generate for it
    elapsed = time.monotonic() - started
    if os.environ.get("TOPOD_SCHEMATHESIS_FAILURES"):
        Path(os.environ["TOPOD_SCHEMATHESIS_FAILURES"]).write_text("\n".join(failures))
    assert not failures, "\n".join(failures[:10])
    assert 201 in statuses["POST /v1/leases (positive)"], statuses  # valid requests were generated, and granted
    assert 400 in statuses["POST /v1/leases (negative)"], statuses  # invalid ones too, and refused
    assert len({key.rsplit(" (", 1)[0] for key in counts}) >= 12, counts  # every operation but the event stream
    assert all(n >= 1 for n in counts.values()), counts
    assert "Traceback" not in daemon.log()
    assert session.get("http://topod/v1/health", timeout=10).status_code == 200
    print(f"schemathesis: {sum(counts.values())} cases over {len(counts)} operations in {elapsed:.1f} s; statuses {statuses}")


def _code(response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None


def _runner(call, strategy, cases: int):
    """A hypothesis test of `cases` cases drawn from `strategy`, each given to `call`."""

    @settings(max_examples=cases, deadline=None, database=None, derandomize=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
              verbosity=hypothesis.Verbosity.quiet)
    @hypothesis.seed(SEED)
    @given(case=strategy)
    def run(case) -> None:
        call(case)

    return run


def _host_fact(response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    code, message = body.get("code"), str(body.get("message", ""))
    return any(part in message for part in HOST_FACTS.get(code, ()))
