"""The OpenAPI 3.1 document of the API; tests hold the server to it.

It says exactly what the server takes: the bounds come from the same constants and
RequestLimits the validators use (the served document follows the running config), and
every status an operation can return is listed, errors with the Error schema, each
described by the codes the server gives it (topod.api.answers.STATUS_OF_CODE). Checked by
openapi-spec-validator, fuzzed by schemathesis (tests/service/test_api_schemathesis.py),
and held to the routes' code by tests/unit/test_openapi_statuses.py, which walks each
handler for the errors it can raise.
"""

from __future__ import annotations

from typing import Any

from topod import __version__
from topod.alloc.service_request import RequestLimits
from topod.api.answers import STATUS_OF_CODE, status_of
from topod.api.body import (DEFAULT_MAX_BYTES, MAX_DEPTH, BodyStalledError, PayloadTooLargeError,
                            UnsupportedMediaTypeError)
from topod.api.peer import PeerDeniedError
from topod.api.schemas import (
    DECISION, ENDED, ERROR, HEALTH, IRQS, LEASE, PLACEMENT, RELOAD_VERDICT, SCOPE_ANSWER, TELEMETRY,
    lease_request, renew_request, scope_request,
)
from topod.errors import InvalidJsonError

# What a status means beyond its codes (which come from the server's own table,
# topod.api.answers.STATUS_OF_CODE, so a new code is documented with its status).
ERROR_NOTES = {
    400: "a body or field the server refuses (the message names it), or a request that is not HTTP the "
         "server can parse: a request line or header over 8190 bytes, a bad chunk (invalid_request)",
    403: "the caller may not do this: a root-only operation, another uid's lease, telemetry for a link "
         "outside the caller's leases, not root nor a member of [daemon] group, or credentials that "
         "cannot be read",
    404: "no lease with that id",
    408: "the body stalled for [api] idle_timeout_seconds; the connection is closed",
    409: "uid_quota and group_quota: [alloc] max_gpus_per_uid, max_gpus_per_group, with held, asked and cap; "
         "retryable false when no release could ever let the request through",
    413: "the body exceeds [api] max_body_bytes",
    415: "a Content-Type charset other than UTF-8",
    429: "too_many_streams: GET /v1/events beyond [api] max_event_streams_per_uid",
    500: "a fault of the server, with a request_id the daemon log carries",
    503: "too_many_connections: the connection was refused at admission ([api] max_connections, "
         "max_connections_per_uid, root_reserved_connections, or a descriptor limit lower than they "
         "need); unavailable: a feature switched off, still setting up after start, or no systemd to "
         "make a scope (the message says which)",
    507: "state_disk_full: the state directory is nearly full; grants are refused, releases still go through",
}
# Any request may be unparsable HTTP (400), meet a fault (500) or be refused at admission
# by the connection gate (503), whatever its operation.
ANY_OPERATION = (400, 500, 503)
# Every operation that reads a body: the body's own errors (topod.api.body), by the status
# the server gives their codes.
BODY_ERRORS = tuple(sorted({status_of(error.code) for error in (
    InvalidJsonError, PayloadTooLargeError, BodyStalledError, UnsupportedMediaTypeError)}))
# Every operation that asks who the caller is: credentials that cannot be read, and the
# caller's authorization (root only, owner or root, member of the group).
CALLER_ERRORS = (status_of(PeerDeniedError.code),)


def error_description(status: int) -> str:
    codes = [code for code, given in STATUS_OF_CODE.items() if given == status]
    note = ERROR_NOTES.get(status)
    return "; ".join(part for part in (", ".join(codes), note) if part)


def _errors(*codes: int) -> dict:
    """The listed error statuses plus ANY_OPERATION's, which any operation can return."""
    return {str(code): {"description": error_description(code),
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for code in sorted({*codes, *ANY_OPERATION})}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: dict, required: bool) -> dict:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


LEASE_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]


def openapi_document(limits: RequestLimits | None = None, *, max_body_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    limits = limits if limits is not None else RequestLimits()
    body_errors = BODY_ERRORS
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
                                       **_errors(*body_errors, *CALLER_ERRORS, 409, 429, 507)}},
            },
            "/v1/leases/{id}": {
                "parameters": LEASE_ID,
                "get": {"summary": "one lease", "operationId": "getLease",
                        "responses": {"200": _json(_ref("Lease"), "lease"), **_errors(404)}},
                "delete": {"summary": "release (owner or root)", "operationId": "release",
                           "responses": {"200": _json({**ENDED, "required": ["released", "gpus"], "properties": {
                               **ENDED["properties"], "released": {"type": "string"}}}, "released"),
                               **_errors(*CALLER_ERRORS, 404)}},
            },
            "/v1/leases/{id}/renew": {
                "parameters": LEASE_ID,
                "post": {"summary": "extend the ttl (owner or root)", "operationId": "renew",
                         "requestBody": _body(renew_request(limits), False),
                         "responses": {"200": _json(_ref("Lease"), "renewed"),
                                       **_errors(*body_errors, *CALLER_ERRORS, 404)}},
            },
            "/v1/leases/{id}/revoke": {
                "parameters": LEASE_ID,
                "post": {"summary": "revoke (root only)", "operationId": "revoke",
                         "responses": {"200": _json({**ENDED, "required": ["revoked", "gpus"], "properties": {
                             **ENDED["properties"], "revoked": {"type": "string"}}}, "revoked"),
                             **_errors(*CALLER_ERRORS, 404)}},
            },
            "/v1/leases/{id}/scope": {
                "parameters": LEASE_ID,
                "post": {"summary": "put a running process in the lease's systemd scope, topod-lease-<id>.scope "
                                    "(owner or root); the lease ends when the scope does",
                         "operationId": "placeInScope",
                         "requestBody": _body(scope_request(limits), True),
                         "responses": {"200": _json(SCOPE_ANSWER, "placed"),
                                       **_errors(*body_errors, *CALLER_ERRORS, 404)}},
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
                                                     **_errors(*body_errors, *CALLER_ERRORS)}}},
            "/v1/reload": {"post": {"summary": "reload the config file and answer the verdict (root only; "
                                               "`topoctl reload`, the unit's ExecReload=)",
                                    "operationId": "reload",
                                    "responses": {"200": _json(RELOAD_VERDICT, "applied: the new config runs; "
                                                               "refused: the running config is kept, reason says why"),
                                                  **_errors(*CALLER_ERRORS)}}},
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
