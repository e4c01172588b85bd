"""The body validation layer, the request limits, the error mapping, the group cache,
the connection gate and the OpenAPI document, without a daemon."""

from __future__ import annotations

import asyncio
import threading
import time

import jsonschema
import pytest
from structlog.testing import capture_logs

from topod.alloc.errors import InvalidRequestError
from topod.alloc.request import Request
from topod.alloc.service_request import (
    PID_MAX_LIMIT, RequestLimits, ServiceRequest, parse_pid_max, validate_renew_body,
)
from topod.api.body import (
    MAX_DEPTH, PayloadTooLargeError, UnsupportedMediaTypeError, nesting_depth, parse_body,
)
from topod.api.openapi import openapi_document
from topod.errors import InvalidJsonError


@pytest.mark.parametrize("raw, charset, error, words", [
    (b"\xff{}", None, InvalidJsonError, "not UTF-8"),
    (b'{"a": "\xed\xa0\x80"}', None, InvalidJsonError, "not UTF-8"),  # an encoded surrogate
    (b"{}", "latin-1", UnsupportedMediaTypeError, "latin-1"),
    (b"{}", "utf-16", UnsupportedMediaTypeError, "utf-16"),
    (b"[" * 100000, None, InvalidJsonError, "100000 deep"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), None, InvalidJsonError, "deep"),
    (b'{"a": NaN}', None, InvalidJsonError, "NaN"),
    (b'{"a": Infinity}', None, InvalidJsonError, "Infinity"),
    (b'{"a": [-Infinity]}', None, InvalidJsonError, "Infinity"),
    (b'{"a": 1e400}', None, InvalidRequestError, "a:"),
    (b'{"a": [1, -1e999]}', None, InvalidRequestError, "a[1]:"),
    (b'{"a": ' + b"9" * 5000 + b"}", None, InvalidJsonError, "5000 digits"),
    (b'{"job": "\\ud800"}', None, InvalidRequestError, "job: contains a lone UTF-16 surrogate"),
    (b'{"job": "x\\u0000"}', None, InvalidRequestError, "job: contains a control character (U+0000)"),
    (b'{"job": "x\\u009b"}', None, InvalidRequestError, "U+009B"),
    (b'{"job": "x\\u007f"}', None, InvalidRequestError, "U+007F"),
    (b'{"j\\u0000b": 1}', None, InvalidRequestError, "j?b"),
    (b'{"a": "' + b"x" * 5000 + b'"}', None, InvalidRequestError, "longer than"),
    (b"", None, InvalidJsonError, "empty"),
    (b"{nope", None, InvalidJsonError, "not JSON"),
])
def test_bad_bodies_are_refused_with_the_right_error(raw, charset, error, words):
    with pytest.raises(error) as caught:
        parse_body(raw, charset=charset)
    assert words in str(caught.value)


def test_body_over_the_limit_is_413():
    with pytest.raises(PayloadTooLargeError) as caught:
        parse_body(b"{}" + b" " * 100, max_bytes=100)
    assert caught.value.code == "payload_too_large"


@pytest.mark.parametrize("raw, charset, expected", [
    (b'{"gpus": 1}', None, {"gpus": 1}),
    (b'{"gpus": 1}', "UTF-8", {"gpus": 1}),
    (b'{"gpus": 1}', "utf8", {"gpus": 1}),
    (b'\xef\xbb\xbf{"gpus": 1}', None, {"gpus": 1}),  # a BOM is accepted everywhere
    (b'{"s": "[[[[\\"{{{{"}', None, {"s": '[[[["{{{{'}),  # brackets in strings do not nest
    (b'{"job": "caf\xc3\xa9 \xe2\x9c\x93"}', None, {"job": "café ✓"}),
    (b"  ", None, {}),  # optional bodies only, see below
])
def test_good_bodies_parse(raw, charset, expected):
    assert parse_body(raw, charset=charset, optional=True) == expected


def test_nesting_depth_is_exact_and_linear():
    assert nesting_depth(b'[1, {"a": [2, "]]]]"]}, [[]]]') == 3
    assert nesting_depth(b'{"a\\"[": [[["x"]]]}') == 4
    started = time.perf_counter()
    assert nesting_depth(b"[]" * 500_000) == 1
    assert nesting_depth(b'"[' + b"\\\\" * 200_000 + b'"') == 0
    assert time.perf_counter() - started < 2.0


# -- service fields ------------------------------------------------------------------

LIMITS = RequestLimits(max_wait_seconds=60.0, max_ttl_seconds=3600.0, pid_max=32768)


@pytest.mark.parametrize("body, field, words", [
    ({"ttl_seconds": 10**400}, "ttl_seconds", "<= 3600 seconds"),
    ({"ttl_seconds": float("nan")}, "ttl_seconds", "finite"),
    ({"ttl_seconds": float("inf")}, "ttl_seconds", "finite"),
    ({"ttl_seconds": 0}, "ttl_seconds", "> 0"),
    ({"ttl_seconds": "5"}, "ttl_seconds", "a number"),
    ({"ttl_seconds": True}, "ttl_seconds", "a number"),
    ({"wait": 10**400}, "wait", "max_wait_seconds"),
    ({"wait": float("nan")}, "wait", "finite"),
    ({"wait": -1}, "wait", ">= 0"),
    ({"wait": 61}, "wait", "<= 60 seconds"),
    ({"wait": False}, "wait", "a number"),
    ({"owner_pid": 2**32}, "owner_pid", "<= 32768"),
    ({"owner_pid": 10**100}, "owner_pid", "digits"),
    ({"owner_pid": 0}, "owner_pid", ">= 1"),
    ({"owner_pid": 12.5}, "owner_pid", "an integer"),
])
def test_service_fields_are_bounded_and_named(body, field, words):
    with pytest.raises(InvalidRequestError) as caught:
        ServiceRequest.split({"gpus": 1, **body}, LIMITS)
    assert caught.value.field == field and words in str(caught.value), str(caught.value)


def test_split_returns_the_service_fields_and_the_engine_body():
    service, engine = ServiceRequest.split({"gpus": 2, "ttl_seconds": 60, "owner_pid": 1, "wait": 1.5,
                                            "job": "x"}, LIMITS)
    assert (service.ttl_seconds, service.owner_pid, service.wait_seconds) == (60.0, 1, 1.5)
    assert engine == {"gpus": 2, "job": "x"}
    service, _ = ServiceRequest.split({"gpus": 1, "ttl_seconds": None, "owner_pid": None, "wait": None})
    assert (service.ttl_seconds, service.owner_pid, service.wait_seconds) == (None, None, 0.0)


def test_renew_body_validation():
    assert validate_renew_body({}, LIMITS) is None
    assert validate_renew_body({"ttl_seconds": None}, LIMITS) is None
    assert validate_renew_body({"ttl_seconds": 30}, LIMITS) == 30.0
    for bad, field in (({"ttl_seconds": float("nan")}, "ttl_seconds"), ({"ttl_seconds": 3601}, "ttl_seconds"),
                       ({"ttl_seconds": 10**400}, "ttl_seconds"), ({"ttl": 1}, "ttl"), ([], "body")):
        with pytest.raises(InvalidRequestError) as caught:
            validate_renew_body(bad, LIMITS)
        assert caught.value.field == field


def test_limits_default_to_the_kernels_limit_and_refuse_nonsense():
    assert RequestLimits().pid_max == PID_MAX_LIMIT
    assert parse_pid_max("32768\n") == 32768
    assert parse_pid_max("garbage") == parse_pid_max(None) == parse_pid_max("99999999999") == PID_MAX_LIMIT
    with pytest.raises(ValueError):
        RequestLimits(max_wait_seconds=float("nan"))
    with pytest.raises(ValueError):
        RequestLimits(pid_max=0)


@pytest.mark.parametrize("field", ["job", "model"])
@pytest.mark.parametrize("value", ["a\x00b", "\ud800", "x\x1b[31m", "\x85"])
def test_engine_validator_refuses_unstorable_strings(field, value):
    with pytest.raises(InvalidRequestError) as caught:
        Request.from_json({"gpus": 1, field: value})
    assert caught.value.field == field


# -- error mapping, peers, events ----------------------------------------------------

def test_unknown_error_codes_are_500_not_400():
    from topod.api.answers import STATUS_OF_CODE, status_of

    assert status_of("state_write_failed") == 500
    assert status_of("some_code_nobody_mapped") == 500
    assert STATUS_OF_CODE["invalid_json"] == 400 and status_of("too_many_connections") == 503


class _Bus:
    def __init__(self) -> None:
        self.queues: list[asyncio.Queue] = []

    def subscribe(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        self.queues.append(queue)
        return queue

    def unsubscribe(self, queue) -> None:
        self.queues.remove(queue)


class _Alloc:
    limits = RequestLimits()

    def leases(self):
        return []

    async def allocate(self, body, who):
        raise AssertionError("not reached")


class _Backend:
    allowed_group = None

    def __init__(self) -> None:
        self.bus = _Bus()
        self.alloc = _Alloc()

    def health(self) -> dict:
        return {"status": "ok", "loops": {"irq": {"age": float("inf")}}}


def _serve(app, body):
    from aiohttp.test_utils import TestClient, TestServer

    async def run():
        async with TestClient(TestServer(app)) as client:
            return await body(client)

    return asyncio.run(run())


def test_a_peer_that_cannot_be_identified_is_403_not_500():
    from topod.api.server import routes

    async def body(client):  # TCP: no SO_PEERCRED, peer_credentials raises PermissionError
        response = await client.post("/v1/leases", data=b'{"gpus": 1}')
        return response.status, await response.json()

    status, error = _serve(routes(_Backend()), body)
    assert (status, error["code"]) == (403, "permission_denied")


def test_non_finite_numbers_never_reach_a_response():
    from topod.api.server import routes

    async def body(client):
        response = await client.get("/v1/health")
        return response.status, await response.text()

    status, text = _serve(routes(_Backend()), body)
    assert status == 200 and '"age": null' in text and "Infinity" not in text


def test_the_event_stream_lets_cancellation_propagate_and_unsubscribes():
    from aiohttp import web

    from topod.api.server import routes

    backend = _Backend()
    app = routes(backend)
    seen: list[str] = []

    @web.middleware
    async def watch(request, handler):
        try:
            return await handler(request)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    app.middlewares.insert(0, watch)

    async def body(client):
        response = await client.get("/v1/events")
        assert (await response.content.readline()).startswith(b'{"event": "subscribed"')
        assert len(backend.bus.queues) == 1
        handler_tasks = [t for t in asyncio.all_tasks() if "handle" in repr(t.get_coro())]
        response.close()
        await client.close()
        for task in handler_tasks:
            task.cancel()
        for _ in range(50):
            await asyncio.sleep(0.01)
            if seen:
                break
        return seen

    assert _serve(app, body) == ["cancelled"]
    assert backend.bus.queues == []


def test_group_lookups_are_cached_and_run_off_the_loop():
    from topod.api.peer import GroupCache, caller_async

    calls: list[tuple[int, int, str]] = []
    now = [0.0]

    def lookup(uid, gid):
        calls.append((uid, gid, threading.current_thread().name))
        time.sleep(0.05)
        return [gid, 4242]

    cache = GroupCache(ttl=60.0, lookup=lookup, clock=lambda: now[0])

    async def run():
        first = await asyncio.gather(*(caller_async(7, 1000, 1000, 4242, cache) for _ in range(20)))
        again = await caller_async(7, 1000, 1000, 4242, cache)
        now[0] = 61.0
        later = await caller_async(7, 1000, 1000, 4242, cache)
        other = await caller_async(7, 1001, 1001, 9999, cache)
        return first, again, later, other

    first, again, later, other = asyncio.run(run())
    assert all(c.may_allocate for c in first) and again.may_allocate and later.may_allocate
    assert not other.may_allocate
    assert [c[:2] for c in calls] == [(1000, 1000), (1000, 1000), (1001, 1001)]  # one per key per ttl
    assert all(name != threading.main_thread().name for _, _, name in calls)


def test_a_caller_is_known_at_once_unless_its_groups_must_be_looked_up():
    from topod.api.peer import GroupCache, caller_now

    cache = GroupCache(ttl=60.0, lookup=lambda uid, gid: [gid, 4242], clock=lambda: 0.0)
    root = caller_now(7, 0, 0, 4242, cache)
    assert root.may_allocate and root.is_admin
    assert caller_now(7, 1000, 4242, 4242, cache).may_allocate, "the primary group needs no lookup"
    assert caller_now(7, 1000, 1000, None, cache).may_allocate is False, "no group configured: nothing to look up"
    assert caller_now(7, 1000, 1000, 4242, cache) is None, "a member by supplementary group: a lookup first"

    async def look_up():
        from topod.api.peer import caller_async

        return await caller_async(7, 1000, 1000, 4242, cache)

    assert asyncio.run(look_up()).may_allocate
    cached = caller_now(7, 1000, 1000, 4242, cache)
    assert cached is not None and cached.may_allocate and not cached.is_admin
    assert caller_now(7, 1000, 1000, 5555, cache).may_allocate is False, "cached groups without 5555"


# -- connections -----------------------------------------------------------------------

def test_accept_failures_are_logged_once_per_burst_and_counted():
    from topod.service.connection_gate import ACCEPT_RESOURCE_MESSAGE, ConnectionGate

    now = [100.0]
    gate = ConnectionGate(3, nofile=1024, clock=lambda: now[0])
    forwarded: list[dict] = []
    handle = gate.exception_handler(lambda loop, context: forwarded.append(context))
    with capture_logs() as logs:
        for second in range(5):  # a flood: every retry fails, 500 times, then one accept works
            now[0] += 1
            for _ in range(500):
                handle(None, {"message": ACCEPT_RESOURCE_MESSAGE, "exception": OSError(24, "Too many open files")})
            assert gate.admit()
            gate.leave()
        handle(None, {"message": "something else"})
    events = [entry["event"] for entry in logs]
    assert events.count("accept_failed") == 1 and events.count("accept_recovered") == 1
    assert next(e for e in logs if e["event"] == "accept_failed")["error"] == "EMFILE"
    assert gate.accept_failures == 2500
    assert forwarded == [{"message": "something else"}]


def test_the_gate_refuses_beyond_the_ceiling_and_the_ceiling_fits_the_descriptor_limit():
    from topod.service.connection_gate import ConnectionGate, connection_ceiling

    assert connection_ceiling(256, 1024) == 256
    assert connection_ceiling(256, 128) == 48  # 80 kept for the daemon, lingering refusals, accepts in flight
    assert connection_ceiling(256, None) == 256
    gate = ConnectionGate(lambda: 2, nofile=None)  # root (uid 0): the reserve does not refuse it
    with capture_logs() as logs:
        assert gate.admit(0) and gate.admit(0) and not gate.admit(0) and not gate.admit(0)
    assert [e["event"] for e in logs] == ["connection_refused"]
    gate.leave(0)
    assert gate.admit(0) and gate.refused == 2


# -- the document ------------------------------------------------------------------------

def test_the_document_is_valid_openapi_3_1():
    from openapi_spec_validator import validate

    document = openapi_document()
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_the_lease_request_schema_refuses_what_the_server_refuses():
    document = openapi_document(LIMITS)
    schema = {**document["components"]["schemas"]["LeaseRequest"], "components": document["components"]}
    jsonschema.validate({"gpus": 2, "job": "train 7", "model": "H100", "ttl_seconds": 60, "wait": 0,
                         "owner_pid": 1, "must_include": [0, "0000:18:00.0", "GPU-1234abcd-ef"]}, schema)
    for bad in ({"gpus": 1, "model": ""}, {"gpus": 1, "job": ""}, {"gpus": 1, "job": "   "},
                {"gpus": 1, "job": "a\x00b"}, {"gpus": 1, "ttl_seconds": 3601}, {"gpus": 1, "wait": 61},
                {"gpus": 1, "owner_pid": 32769}, {"gpus": 1, "ttl_seconds": 0}, {"gpus": 0},
                {"gpus": 1, "must_include": ["card0"]}, {"gpus": 1, "x": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(InvalidRequestError):
            service, engine = ServiceRequest.split(bad, LIMITS)
            Request.from_json(engine)
    renew = document["paths"]["/v1/leases/{id}/renew"]["post"]["requestBody"]
    assert renew["required"] is False
    jsonschema.validate({}, renew["content"]["application/json"]["schema"])


def test_every_operation_documents_its_errors_with_the_error_schema():
    document = openapi_document()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            assert {"500", "503"} <= set(operation["responses"]), (path, method)
            if "requestBody" in operation:
                assert {"400", "413", "415"} <= set(operation["responses"]), (path, method)
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert response["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/Error"}
