"""The API server: aiohttp routes over a Unix socket, JSON in and out, errors as
{"code", "message"} with fitting status codes (topod.api.answers: the encoding and the
error mapping).

Request bodies go through topod.api.body (size, charset, depth, finite numbers, clean
strings) before any endpoint sees them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiohttp import web

from topod.alloc.service_request import RequestLimits, validate_renew_body
from topod.api.answers import HTTP_CODES, dumps, error_document, error_response, event_line, json_response
from topod.api.body import DEFAULT_MAX_BYTES, BodyStalledError, PayloadTooLargeError, parse_body
from topod.api.half_close import peer_gone
from topod.api.peer import PeerDeniedError, caller_async, peer_credentials, peer_uid
from topod.errors import TopodError, UnavailableError


class Backend(Protocol):
    """What the daemon offers the API."""

    alloc: Any
    allowed_group: int | None

    def topology_json(self) -> dict: ...
    def health(self) -> dict: ...
    async def irq_report(self) -> dict: ...
    def irq_section(self) -> dict: ...
    def links_report(self) -> dict: ...
    def telemetry(self, body: Any, caller: Any) -> dict: ...
    def metrics_text(self) -> str: ...
    def lease_json(self, lease) -> dict: ...
    def lease_text(self, lease) -> str | None: ...


BACKEND = web.AppKey("backend", Backend)  # typed application key: what every handler serves from
STREAMS = web.AppKey("event_streams", dict)  # uid -> open GET /v1/events streams


def lease_text(backend: Backend, lease: Any) -> str:
    """A lease as JSON text: the store's (one encoding per lease version), else json_of
    encoded here (a lease no longer current, or one holding NaN: null for it)."""
    text = backend.lease_text(lease)
    return text if text is not None else dumps(backend.lease_json(lease))


def lease_response(backend: Backend, lease: Any, status: int = 200) -> web.Response:
    return web.Response(text=lease_text(backend, lease), status=status, content_type="application/json")


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = HTTP_CODES.get(exc.status, "http_error")
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(code, exc.reason or str(exc), exc.status, headers=allow)
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place that turns faults into a 500
        status, document = error_document(exc, request.method, request.path)
        response = json_response(document, status=status)
        if isinstance(exc, BodyStalledError):
            await _answer_and_close(request, response)
        return response


async def _answer_and_close(request: web.Request, response: web.StreamResponse) -> None:
    """Send the answer, then close the connection at once. aiohttp would otherwise read
    and drop the rest of the body for up to 10 s (lingering, so that a client still
    sending can read an early answer); a body that stalled has no rest coming."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()  # the transport sends what was written, then closes


async def caller(request: web.Request):
    backend: Backend = request.app[BACKEND]
    pid, uid, gid = transport_peer(request.transport)
    return await caller_async(pid, uid, gid, backend.allowed_group)


def transport_peer(transport: Any) -> tuple[int | None, int, int]:
    """(pid, uid, gid) of a connection's peer; PeerDeniedError when they cannot be read."""
    try:
        return peer_credentials(transport.get_extra_info("socket") if transport is not None else None)
    except (PermissionError, OSError) as exc:
        raise PeerDeniedError(f"cannot identify the caller: {exc}") from None


def request_limits(backend: Backend) -> RequestLimits:
    limits = getattr(getattr(backend, "alloc", None), "limits", None)
    return limits if isinstance(limits, RequestLimits) else RequestLimits()


def _api_setting(backend: Backend, key: str, kind: type, default: Any) -> Any:
    """[api] `key` of the backend's current config (it follows a reload), else `default`
    (a backend without a config: tools, tests of parts)."""
    config = getattr(backend, "config", None)
    try:
        return kind(config.get("api", key))
    except (AttributeError, KeyError, TypeError, ValueError):
        return default


def max_body_bytes(backend: Backend) -> int:
    return _api_setting(backend, "max_body_bytes", int, DEFAULT_MAX_BYTES)


DEFAULT_SILENCE_SECONDS = 30.0


def body_silence_seconds(backend: Backend) -> float:
    """How long a body may stall: [api] idle_timeout_seconds, the limit on a silent
    connection, which aiohttp applies only until the headers are complete."""
    return _api_setting(backend, "idle_timeout_seconds", float, DEFAULT_SILENCE_SECONDS)


def check_declared_size(content_length: int | None, limit: int) -> None:
    if content_length is not None and content_length > limit:
        raise PayloadTooLargeError(f"request body is {content_length} bytes; at most {limit} ([api] max_body_bytes)")


async def read_body(request: web.Request, limit: int, silence: float = DEFAULT_SILENCE_SECONDS) -> bytes:
    """The raw body, refused as soon as it is known to exceed `limit` bytes, or when the
    client sends nothing of it for `silence` seconds (the connection is then closed: a
    client that stops half-way would otherwise hold it, and its handler, for ever)."""
    check_declared_size(request.content_length, limit)
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(silence) as deadline:
            while chunk := await request.content.readany():
                deadline.reschedule(loop.time() + silence)
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLargeError(f"request body is over {limit} bytes ([api] max_body_bytes)")
                chunks.append(chunk)
    except TimeoutError:
        expected = f" of {request.content_length}" if request.content_length is not None else ""
        raise BodyStalledError(f"the request body stalled: {size}{expected} bytes arrived, then nothing for "
                               f"{silence:g} s ([api] idle_timeout_seconds)") from None
    return b"".join(chunks)


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    backend = request.app[BACKEND]
    limit = max_body_bytes(backend)
    raw = await read_body(request, limit, body_silence_seconds(backend))
    return parse_body(raw, charset=request.charset, max_bytes=limit, optional=optional)


def routes(backend: Backend) -> web.Application:
    # read_body enforces [api] max_body_bytes per request (it follows a reload); this is
    # only aiohttp's own ceiling for request.read(), which nothing here calls.
    app = web.Application(middlewares=[errors_as_json], client_max_size=64 * 1024 * 1024)
    app[BACKEND] = backend
    app[STREAMS] = {}
    app.add_routes([
        web.get("/v1/health", health),
        web.get("/v1/topology", topology),
        web.get("/v1/leases", list_leases),
        web.post("/v1/leases", create_lease),
        web.get("/v1/leases/{id}", get_lease),
        web.delete("/v1/leases/{id}", delete_lease),
        web.post("/v1/leases/{id}/renew", renew_lease),
        web.post("/v1/leases/{id}/revoke", revoke_lease),
        web.post("/v1/leases/{id}/scope", place_in_scope),
        web.get("/v1/events", events),
        web.get("/v1/irqs", irqs),
        web.get("/v1/links", links),
        web.post("/v1/telemetry", telemetry),
        web.post("/v1/reload", reload_config),
        web.get("/v1/openapi.json", openapi),
        web.get("/metrics", metrics),
    ])
    return app


async def health(request: web.Request) -> web.Response:
    return json_response(request.app[BACKEND].health())


async def topology(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    cached = getattr(backend, "topology_body", None)
    if cached is None:  # a backend without a cache (tools, tests of parts)
        return json_response(backend.topology_json())
    return web.Response(body=await cached(), content_type="application/json")


async def list_leases(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    parts = [lease_text(backend, lease) for lease in backend.alloc.leases()]
    return web.Response(text='{"leases": [' + ", ".join(parts) + "]}", content_type="application/json")


async def create_lease(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    who = await caller(request)
    body = await read_json(request)
    # A queued request belongs to its connection: the service grants only while it is open.
    lease = await backend.alloc.allocate(body, who, connected=lambda: _connected(request))
    # The answer is written here, not after the handler returns, so that a lease whose
    # answer cannot reach its client (gone, write failed, cancelled) is taken back at once:
    # a lease exists exactly when its client was told so.
    response = lease_response(backend, lease, status=201)
    delivered = False
    try:
        await response.prepare(request)
        await response.write_eof()
        delivered = _connected(request)
    except ConnectionError:
        pass
    finally:
        backend.alloc.answered(lease, delivered)
    return response


def _connected(request: web.Request) -> bool:
    """Still there to be answered; a half-closed client is asked whether it is gone since
    (topod.api.half_close), others' EOF already closed their transport."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return False
    return not (getattr(request.protocol, "half_closed", False) and peer_gone(transport))


async def get_lease(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    return lease_response(backend, backend.alloc.get(request.match_info["id"]))


async def delete_lease(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    lease = await backend.alloc.release(request.match_info["id"], await caller(request))
    return web.Response(text=released_text(lease), content_type="application/json")


def released_text(lease: Any) -> str:
    return dumps({"released": lease.id, "gpus": list(lease.gpus)})


async def renew_lease(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    who = await caller(request)
    body = await read_json(request, optional=True)
    ttl = validate_renew_body(body, request_limits(backend))
    lease = await backend.alloc.renew(request.match_info["id"], who, ttl)
    return lease_response(backend, lease)


async def revoke_lease(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    lease = await backend.alloc.revoke(request.match_info["id"], await caller(request))
    return json_response({"revoked": lease.id, "gpus": list(lease.gpus)})


async def place_in_scope(request: web.Request) -> web.Response:
    """POST /v1/leases/{id}/scope {"pid": N}: a local scheduler puts a process it started
    in its lease's systemd scope (topod.service.lease_scope says who may, and what the
    answer claims)."""
    backend = request.app[BACKEND]
    who = await caller(request)
    body = await read_json(request)
    scopes = getattr(backend, "scopes", None)
    if scopes is None:  # a backend without scopes (tools, tests of parts)
        raise UnavailableError("this server places no process in a scope")
    return json_response(await scopes.place(request.match_info["id"], body, who))


class TooManyStreamsError(TopodError):
    code = "too_many_streams"


async def events(request: web.Request) -> web.StreamResponse:
    backend = request.app[BACKEND]
    bus = backend.bus
    uid = peer_uid(request.transport)  # None: not a Unix socket peer (counted as one user)
    streams = request.app[STREAMS]
    share = _api_setting(backend, "max_event_streams_per_uid", int, 8)
    if uid != 0 and streams.get(uid, 0) >= share:
        # A stream holds a connection for ever: without a share one user's idle streams
        # would take every connection there is.
        raise TooManyStreamsError(f"uid {uid} already has {streams[uid]} event streams open "
                                  f"([api] max_event_streams_per_uid = {share}); close one first")
    streams[uid] = streams.get(uid, 0) + 1
    try:
        return await _stream_events(request, bus)
    finally:
        left = streams.get(uid, 1) - 1
        if left > 0:
            streams[uid] = left
        else:
            streams.pop(uid, None)


async def _stream_events(request: web.Request, bus: Any) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
    await response.prepare(request)
    queue = bus.subscribe()
    try:
        await response.write(event_line({"event": "subscribed"}))
        while True:
            try:
                async with asyncio.timeout(15.0):
                    record = await queue.get()
            except TimeoutError:
                record = {"event": "heartbeat"}
            await response.write(event_line(record))
    except ConnectionResetError:
        pass  # the client went away; a cancellation (shutdown, disconnect) propagates
    finally:
        bus.unsubscribe(queue)
    return response


async def irqs(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    report = dict(await backend.irq_report())
    # The effective [irq] section, so `topoctl irq plan` plans as this daemon would.
    report["settings"] = backend.irq_section()
    return json_response(report)


async def links(request: web.Request) -> web.Response:
    return json_response(request.app[BACKEND].links_report())


MAX_TELEMETRY_BYTES = 2**63 - 1


async def telemetry(request: web.Request) -> web.Response:
    who = await caller(request)
    body = await read_json(request)
    moved = body.get("bytes") if isinstance(body, dict) else None
    if isinstance(moved, int) and not isinstance(moved, bool) and moved > MAX_TELEMETRY_BYTES:
        from topod.probe.linkstate import TelemetryError

        raise TelemetryError(f"telemetry: bytes must be <= {MAX_TELEMETRY_BYTES}")
    return json_response(request.app[BACKEND].telemetry(body, who), status=202)


async def openapi(request: web.Request) -> web.Response:
    from topod.api.openapi import openapi_document

    backend = request.app[BACKEND]
    return json_response(openapi_document(request_limits(backend), max_body_bytes=max_body_bytes(backend)))


async def metrics(request: web.Request) -> web.Response:
    text = request.app[BACKEND].metrics_text()
    response = web.Response(body=text.encode())
    response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
    return response


async def reload_config(request: web.Request) -> web.Response:
    """Root only: reload the config file and answer the daemon's verdict (what SIGHUP
    only logs), so that `topoctl reload` as ExecReload= fails a rejected file."""
    who = await caller(request)
    if not who.is_admin:
        raise PeerDeniedError("reloading the configuration is root-only")
    return json_response(await request.app[BACKEND].reload_config())
