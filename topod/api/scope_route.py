"""POST /v1/leases/{id}/scope {"pid": N}: a local scheduler puts a process it started in
its lease's systemd scope (topod.service.lease_scope says who may, and what the answer
claims). Its own module: the route is small, the server's table names it."""

from __future__ import annotations

from aiohttp import web

from topod.api.answers import json_response
from topod.api.server import BACKEND, caller, read_json


async def place_in_scope(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    who = await caller(request)
    body = await read_json(request)
    scopes = getattr(backend, "scopes", None)
    if scopes is None:  # a backend without scopes (tools, tests of parts)
        from topod.errors import UnavailableError

        raise UnavailableError("this server places no process in a scope")
    return json_response(await scopes.place(request.match_info["id"], body, who))
