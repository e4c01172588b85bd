"""The API server: aiohttp routes over a Unix socket, JSON in and out, errors as
{"code", "message"} with fitting status codes."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from aiohttp import web

from topod.api.peer import caller_from, peer_credentials
from topod.alloc.errors import InvalidRequestError
from topod.errors import InvalidJsonError, TopodError

STATUS_OF_CODE = {
    "invalid_request": 400,
    "invalid_json": 400,
    "unknown_gpu": 400,
    "permission_denied": 403,
    "lease_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "insufficient_gpus": 409,
    "insufficient_cpus": 409,
    "level_unreachable": 409,
    "gpu_already_leased": 409,
    "wait_timeout": 409,
    "queue_full": 429,
    "invalid_telemetry": 400,
    "unavailable": 503,
}


class Backend(Protocol):
    """What the daemon offers the API."""

    alloc: Any
    allowed_group: int | None

    def topology_json(self) -> dict: ...
    def health(self) -> dict: ...
    def irq_report(self) -> dict: ...
    def links_report(self) -> dict: ...
    def telemetry(self, body: Any) -> dict: ...
    def metrics_text(self) -> str: ...
    def lease_json(self, lease) -> dict: ...


def error_response(code: str, message: str, status: int | None = None) -> web.Response:
    return web.json_response({"code": code, "message": message}, status=status or STATUS_OF_CODE.get(code, 400))


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except TopodError as exc:
        return error_response(exc.code, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return error_response(code, exc.reason or str(exc), exc.status)


def caller(request: web.Request):
    backend: Backend = request.app["backend"]
    pid, uid, gid = peer_credentials(request.transport.get_extra_info("socket") if request.transport else None)
    return caller_from(pid, uid, gid, backend.allowed_group)


async def read_json(request: web.Request, *, optional: bool = False) -> Any:
    text = await request.text()
    if not text.strip():
        if optional:
            return {}
        raise InvalidJsonError("request body is empty; expected a JSON object")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidJsonError(f"request body is not JSON: {exc}") from None


def routes(backend: Backend) -> web.Application:
    app = web.Application(middlewares=[errors_as_json], client_max_size=1024 * 1024)
    app["backend"] = backend
    app.add_routes([
        web.get("/v1/health", health),
        web.get("/v1/topology", topology),
        web.get("/v1/leases", list_leases),
        web.post("/v1/leases", create_lease),
        web.get("/v1/leases/{id}", get_lease),
        web.delete("/v1/leases/{id}", delete_lease),
        web.post("/v1/leases/{id}/renew", renew_lease),
        web.post("/v1/leases/{id}/revoke", revoke_lease),
        web.get("/v1/events", events),
        web.get("/v1/irqs", irqs),
        web.get("/v1/links", links),
        web.post("/v1/telemetry", telemetry),
        web.get("/v1/openapi.json", openapi),
        web.get("/metrics", metrics),
    ])
    return app


async def health(request: web.Request) -> web.Response:
    return web.json_response(request.app["backend"].health())


async def topology(request: web.Request) -> web.Response:
    return web.json_response(request.app["backend"].topology_json())


async def list_leases(request: web.Request) -> web.Response:
    backend = request.app["backend"]
    return web.json_response({"leases": [backend.lease_json(lease) for lease in backend.alloc.leases()]})


async def create_lease(request: web.Request) -> web.Response:
    backend = request.app["backend"]
    who = caller(request)
    body = await read_json(request)
    lease = await backend.alloc.allocate(body, who)
    return web.json_response(backend.lease_json(lease), status=201)


async def get_lease(request: web.Request) -> web.Response:
    backend = request.app["backend"]
    return web.json_response(backend.lease_json(backend.alloc.get(request.match_info["id"])))


async def delete_lease(request: web.Request) -> web.Response:
    backend = request.app["backend"]
    lease = backend.alloc.release(request.match_info["id"], caller(request))
    return web.json_response({"released": lease.id, "gpus": list(lease.gpus)})


async def renew_lease(request: web.Request) -> web.Response:
    backend = request.app["backend"]
    who = caller(request)
    body = await read_json(request, optional=True)
    if not isinstance(body, dict) or set(body) - {"ttl_seconds"}:
        raise InvalidRequestError("body", "renew takes an object with at most 'ttl_seconds'")
    lease = backend.alloc.renew(request.match_info["id"], who, body.get("ttl_seconds"))
    return web.json_response(backend.lease_json(lease))


async def revoke_lease(request: web.Request) -> web.Response:
    backend = request.app["backend"]
    lease = backend.alloc.revoke(request.match_info["id"], caller(request))
    return web.json_response({"revoked": lease.id, "gpus": list(lease.gpus)})


async def events(request: web.Request) -> web.StreamResponse:
    bus = request.app["backend"].bus
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"})
    await response.prepare(request)
    queue = bus.subscribe()
    try:
        await response.write(json.dumps({"event": "subscribed"}).encode() + b"\n")
        while True:
            try:
                record = await asyncio.wait_for(queue.get(), timeout=15.0)
            except TimeoutError:
                record = {"event": "heartbeat"}
            await response.write(json.dumps(record, default=str).encode() + b"\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        bus.unsubscribe(queue)
    return response


async def irqs(request: web.Request) -> web.Response:
    return web.json_response(request.app["backend"].irq_report())


async def links(request: web.Request) -> web.Response:
    return web.json_response(request.app["backend"].links_report())


async def telemetry(request: web.Request) -> web.Response:
    body = await read_json(request)
    return web.json_response(request.app["backend"].telemetry(body), status=202)


async def openapi(request: web.Request) -> web.Response:
    from topod.api.openapi import openapi_document

    return web.json_response(openapi_document())


async def metrics(request: web.Request) -> web.Response:
    text = request.app["backend"].metrics_text()
    response = web.Response(body=text.encode())
    response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
    return response
