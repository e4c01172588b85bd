"""The OpenAPI 3.1 document of the API; tests hold the server to it.

It says exactly what the server takes: the bounds come from the same constants and
RequestLimits the validators use (the served document follows the running config), and
every status an operation can return is listed, errors with the Error schema. Checked by
openapi-spec-validator and fuzzed by schemathesis (tests/service/test_api_schemathesis.py).
"""

from __future__ import annotations

from typing import Any

from topod import __version__
from topod.alloc.service_request import RequestLimits
from topod.api.body import DEFAULT_MAX_BYTES, MAX_DEPTH
from topod.api.schemas import (
    DECISION, ENDED, ERROR, HEALTH, IRQS, LEASE, PLACEMENT, RELOAD_VERDICT, SCOPE_ANSWER, TELEMETRY,
    lease_request, renew_request, scope_request,
)

ERROR_DESCRIPTIONS = {
    400: "invalid_json, invalid_request, unknown_gpu, unknown_device, invalid_telemetry",
    403: "permission_denied",
    404: "lease_not_found",
    408: "request_timeout: the body stalled for [api] idle_timeout_seconds; the connection is closed",
    409: "insufficient_gpus, insufficient_cpus, insufficient_nics, level_unreachable, gpu_already_leased, wait_timeout, "
         "uid_quota and group_quota ([alloc] max_gpus_per_uid, max_gpus_per_group: with held, asked and cap); "
         "retryable false when no release could ever let the request through",
    413: "payload_too_large: the body exceeds [api] max_body_bytes",
    415: "unsupported_media_type: a Content-Type charset other than UTF-8",
    429: "queue_full; too_many_streams (GET /v1/events beyond [api] max_event_streams_per_uid)",
    500: "internal_error (or another server fault), with a request_id the daemon log carries",
    503: "unavailable (a feature switched off, or still setting up after start, or no systemd to make a "
         "scope: the message says which), too_many_connections ([api] max_connections, max_connections_per_uid, "
         "root_reserved_connections)",
}


def _errors(*codes: int) -> dict:
    """The listed error statuses plus 500 and 503, which any operation can return."""
    return {str(code): {"description": ERROR_DESCRIPTIONS[code],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for code in sorted({*codes, 500, 503})}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: dict, required: bool) -> dict:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


LEASE_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]


def openapi_document(limits: RequestLimits | None = None, *, max_body_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    limits = limits if limits is not None else RequestLimits()
    body_errors = (400, 408, 413, 415)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "topod API", "version": __version__,
            "description": "HTTP/1.1 + JSON on a Unix socket (curl --unix-socket /run/topod/topod.sock "
                           "http://topod/v1/...). Request bodies: UTF-8 JSON (a Content-Type naming another "
                           f"charset is 415; a leading BOM is ignored), at most {max_body_bytes} bytes (413), "
                           f"nested at most {MAX_DEPTH} deep, finite numbers only (NaN/Infinity are 400 "
                           "invalid_json), strings without control characters or lone surrogates (400 "
                           "invalid_request naming the field). Any other method on a path is 405 with an Allow "
                           "header; an unknown path is 404 not_found.",
        },
        "servers": [{"url": "http://topod"}],
        "paths": {
            "/v1/health": {"get": {"summary": "daemon health", "operationId": "health",
                                   "responses": {"200": _json(_ref("Health"), "health"), **_errors()}}},
            "/v1/topology": {"get": {"summary": "the host model (schema as `topoctl topo --json`)",
                                     "operationId": "topology",
                                     "responses": {"200": _json({"type": "object"}, "topology"), **_errors()}}},
            "/v1/leases": {
                "get": {"summary": "list leases", "operationId": "listLeases", "responses": {
                    "200": _json({"type": "object", "required": ["leases"], "properties": {
                        "leases": {"type": "array", "items": _ref("Lease")}}}, "leases"),
                    **_errors()}},
                "post": {"summary": "allocate GPUs", "operationId": "allocate",
                         "requestBody": _body(_ref("LeaseRequest"), True),
                         "responses": {"201": _json(_ref("Lease"), "granted"),
                                       **_errors(*body_errors, 403, 409, 429)}},
            },
            "/v1/leases/{id}": {
                "parameters": LEASE_ID,
                "get": {"summary": "one lease", "operationId": "getLease",
                        "responses": {"200": _json(_ref("Lease"), "lease"), **_errors(404)}},
                "delete": {"summary": "release (owner or root)", "operationId": "release",
                           "responses": {"200": _json({**ENDED, "required": ["released", "gpus"], "properties": {
                               **ENDED["properties"], "released": {"type": "string"}}}, "released"),
                               **_errors(403, 404)}},
            },
            "/v1/leases/{id}/renew": {
                "parameters": LEASE_ID,
                "post": {"summary": "extend the ttl (owner or root)", "operationId": "renew",
                         "requestBody": _body(renew_request(limits), False),
                         "responses": {"200": _json(_ref("Lease"), "renewed"), **_errors(*body_errors, 403, 404)}},
            },
            "/v1/leases/{id}/revoke": {
                "parameters": LEASE_ID,
                "post": {"summary": "revoke (root only)", "operationId": "revoke",
                         "responses": {"200": _json({**ENDED, "required": ["revoked", "gpus"], "properties": {
                             **ENDED["properties"], "revoked": {"type": "string"}}}, "revoked"),
                             **_errors(403, 404)}},
            },
            "/v1/leases/{id}/scope": {
                "parameters": LEASE_ID,
                "post": {"summary": "put a running process in the lease's systemd scope, topod-lease-<id>.scope "
                                    "(owner or root); the lease ends when the scope does",
                         "operationId": "placeInScope",
                         "requestBody": _body(scope_request(limits), True),
                         "responses": {"200": _json(SCOPE_ANSWER, "placed"),
                                       **_errors(*body_errors, 403, 404)}},
            },
            "/v1/events": {"get": {"summary": "event stream, one JSON object per line", "operationId": "events",
                                   "responses": {"200": {"description": "events", "content": {
                                       "application/x-ndjson": {"schema": {"type": "string"}}}}, **_errors(429)}}},
            "/v1/irqs": {"get": {"summary": "IRQ plan and last cycle", "operationId": "irqs",
                                 "responses": {"200": _json(IRQS, "irqs"), **_errors()}}},
            "/v1/links": {"get": {"summary": "expected vs measured links", "operationId": "links",
                                  "responses": {"200": _json({"type": "object"}, "links"), **_errors()}}},
            "/v1/telemetry": {"post": {"summary": "a job's observed transfer", "operationId": "telemetry",
                                       "requestBody": _body(_ref("Telemetry"), True),
                                       "responses": {"202": _json({"type": "object"}, "accepted"),
                                                     **_errors(*body_errors)}}},
            "/v1/reload": {"post": {"summary": "reload the config file and answer the verdict (root only; "
                                               "`topoctl reload`, the unit's ExecReload=)",
                                    "operationId": "reload",
                                    "responses": {"200": _json(RELOAD_VERDICT, "applied: the new config runs; "
                                                               "refused: the running config is kept, reason says why"),
                                                  **_errors(403)}}},
            "/v1/openapi.json": {"get": {"summary": "this document", "operationId": "openapi",
                                         "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1"),
                                                       **_errors()}}},
            "/metrics": {"get": {"summary": "Prometheus exposition", "operationId": "metrics", "responses": {
                "200": {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                **_errors()}}},
        },
        "components": {"schemas": {
            "Error": ERROR, "LeaseRequest": lease_request(limits), "Lease": LEASE, "Placement": PLACEMENT,
            "Decision": DECISION, "Health": HEALTH, "Telemetry": TELEMETRY,
        }},
    }
