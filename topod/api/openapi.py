"""The OpenAPI 3 document of the API; tests hold the server to it."""

from __future__ import annotations

from topod import __version__

ERROR = {"type": "object", "required": ["code", "message"], "additionalProperties": False,
         "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}

LEASE_REQUEST = {
    "type": "object",
    "required": ["gpus"],
    "additionalProperties": False,
    "properties": {
        "gpus": {"type": "integer", "minimum": 1, "description": "number of GPUs"},
        "must_include": {"type": "array", "items": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
                         "description": "GPU indices or PCI addresses the set must contain"},
        "level": {"type": "string", "enum": ["best", "good", "any"]},
        "priority": {"type": "integer"},
        "cpus_per_gpu": {"type": "integer", "minimum": 0},
        "min_memory_mib": {"type": "integer", "minimum": 0},
        "model": {"type": "string", "description": "substring of the GPU model name"},
        "preemptible": {"type": "boolean"},
        "ttl_seconds": {"type": "number", "exclusiveMinimum": 0},
        "owner_pid": {"type": "integer", "minimum": 1, "description": "the lease ends when this process exits"},
        "wait": {"type": "number", "minimum": 0, "description": "seconds to queue; 0 fails fast"},
        "job": {"type": "string"},
    },
}

LEASE = {
    "type": "object",
    "required": ["id", "state", "owner_uid", "gpus", "cpus", "memory_nodes", "decision", "environment"],
    "properties": {
        "id": {"type": "string"},
        "state": {"type": "string", "enum": ["active", "preempting"]},
        "owner_uid": {"type": "integer"},
        "owner_gid": {"type": "integer"},
        "owner_pid": {"type": ["integer", "null"]},
        "requester_pid": {"type": ["integer", "null"]},
        "job": {"type": ["string", "null"]},
        "priority": {"type": "integer"},
        "preemptible": {"type": "boolean"},
        "gpus": {"type": "array", "items": {"type": "integer"}},
        "cpus": {"type": "array", "items": {"type": "integer"}},
        "memory_nodes": {"type": "array", "items": {"type": "integer"}},
        "created": {"type": "number"},
        "expires": {"type": ["number", "null"]},
        "ttl_seconds": {"type": ["number", "null"]},
        "preempt_deadline": {"type": ["number", "null"]},
        "decision": {"type": "object", "description": "GPUs with their CPUs and nodes, cost, level, satisfaction, "
                                                     "performance estimate"},
        "environment": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def _error_responses(*codes: int) -> dict:
    return {str(code): {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for code in codes}


def _json(schema_ref: str, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": schema_ref}}}}


def _any_json(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"type": "object"}}}}


LEASE_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]


def openapi_document() -> dict:
    return {
        "openapi": "3.0.3",
        "info": {"title": "topod API", "version": __version__,
                 "description": "HTTP/1.1 + JSON on a Unix socket (curl --unix-socket /run/topod/topod.sock http://topod/v1/...)"},
        "servers": [{"url": "http://topod"}],
        "paths": {
            "/v1/health": {"get": {"summary": "daemon health", "responses": {"200": _any_json("health")}}},
            "/v1/topology": {"get": {"summary": "the host model (schema as `topoctl topo --json`)",
                                     "responses": {"200": _any_json("topology")}}},
            "/v1/leases": {
                "get": {"summary": "list leases", "responses": {"200": {"description": "leases", "content": {
                    "application/json": {"schema": {"type": "object", "properties": {
                        "leases": {"type": "array", "items": {"$ref": "#/components/schemas/Lease"}}}}}}}}},
                "post": {"summary": "allocate GPUs", "requestBody": {"required": True, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/LeaseRequest"}}}},
                         "responses": {"201": _json("#/components/schemas/Lease", "granted"),
                                       **_error_responses(400, 403, 409, 429)}},
            },
            "/v1/leases/{id}": {
                "parameters": LEASE_ID,
                "get": {"summary": "one lease", "responses": {"200": _json("#/components/schemas/Lease", "lease"),
                                                               **_error_responses(404)}},
                "delete": {"summary": "release", "responses": {"200": _any_json("released"),
                                                                **_error_responses(403, 404)}},
            },
            "/v1/leases/{id}/renew": {
                "parameters": LEASE_ID,
                "post": {"summary": "extend the ttl", "requestBody": {"required": False, "content": {
                    "application/json": {"schema": {"type": "object", "additionalProperties": False, "properties": {
                        "ttl_seconds": {"type": "number", "exclusiveMinimum": 0}}}}}},
                         "responses": {"200": _json("#/components/schemas/Lease", "renewed"),
                                       **_error_responses(400, 403, 404)}},
            },
            "/v1/leases/{id}/revoke": {
                "parameters": LEASE_ID,
                "post": {"summary": "revoke (root only)", "responses": {"200": _any_json("revoked"),
                                                                        **_error_responses(403, 404)}},
            },
            "/v1/events": {"get": {"summary": "event stream, one JSON object per line", "responses": {
                "200": {"description": "events", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}}}},
            "/v1/irqs": {"get": {"summary": "IRQ plan and last cycle", "responses": {"200": _any_json("irqs")}}},
            "/v1/links": {"get": {"summary": "expected vs measured links", "responses": {"200": _any_json("links")}}},
            "/v1/telemetry": {"post": {"summary": "a job's observed transfer", "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"type": "object", "required": ["link", "bytes", "seconds"], "properties": {
                    "link": {"type": "string"}, "bytes": {"type": "number", "exclusiveMinimum": 0},
                    "seconds": {"type": "number", "exclusiveMinimum": 0}}}}}},
                "responses": {"202": _any_json("accepted"), **_error_responses(400, 503)}}},
            "/v1/openapi.json": {"get": {"summary": "this document", "responses": {"200": _any_json("OpenAPI")}}},
            "/metrics": {"get": {"summary": "Prometheus exposition", "responses": {"200": {
                "description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        },
        "components": {"schemas": {"Error": ERROR, "LeaseRequest": LEASE_REQUEST, "Lease": LEASE}},
    }
