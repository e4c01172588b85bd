"""What the API answers: strict JSON (a NaN or Infinity becomes null, in every response
and every event line) and the mapping of an error to its status and {"code", "message"}
body. An unexpected exception is a 500 `internal_error` whose body carries a short
request id; the traceback goes to the log under that id, never to the client.

Its own module because two layers answer through it: the aiohttp routes
(topod.api.server) and the service's socket protocol (topod.service.server), which
answers what aiohttp could not parse with it too.
"""

from __future__ import annotations

import json
import math
import traceback
import uuid
from typing import Any

import structlog
from aiohttp import web

from topod.errors import TopodError

log = structlog.get_logger("topod")

STATUS_OF_CODE = {
    "invalid_request": 400,
    "invalid_json": 400,
    "unknown_gpu": 400,
    "unknown_device": 400,
    "invalid_telemetry": 400,
    "permission_denied": 403,
    "lease_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "insufficient_gpus": 409,
    "insufficient_cpus": 409,
    "insufficient_nics": 409,
    "uid_quota": 409,
    "group_quota": 409,
    "level_unreachable": 409,
    "gpu_already_leased": 409,
    "wait_timeout": 409,
    "request_timeout": 408,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "queue_full": 429,
    "too_many_streams": 429,
    "internal_error": 500,
    "state_write_failed": 500,
    "state_disk_full": 507,
    "unavailable": 503,
    "too_many_connections": 503,
}
# The state dir's disk failed a write: a 500 the log already tells (lease_not_stored, the
# writer's own events), not a bug with a traceback to read.
DISK_FAULT_CODES = frozenset({"state_write_failed"})
# A code not listed above is a fault of ours (a state write failed, a host file vanished):
# 500, never a 400 that blames the client.
UNKNOWN_CODE_STATUS = 500
HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
              415: "unsupported_media_type"}


def dumps(value: Any) -> str:
    """Strict JSON out: a NaN or Infinity in a response (a loop that never ran, a value
    from an older state file) becomes null, so every response parses as JSON."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def json_response(data: Any, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers, dumps=dumps)


def status_of(code: str) -> int:
    return STATUS_OF_CODE.get(code, UNKNOWN_CODE_STATUS)


def error_response(code: str, message: str, status: int | None = None, headers: dict | None = None,
                   **extra: Any) -> web.Response:
    return json_response({"code": code, "message": message, **extra}, status=status or status_of(code),
                         headers=headers)


def internal_error(request: web.Request, exc: BaseException, code: str = "internal_error",
                   message: str = "internal error") -> web.Response:
    """A 500: the client gets the code and a request id, the log the traceback under it."""
    return json_response(fault_document(request.method, request.path, exc, code, message)[1], status=500)


def fault_document(method: str, path: str, exc: BaseException, code: str = "internal_error",
                   message: str = "internal error") -> tuple[int, dict[str, Any]]:
    """(500, the error body) for a fault of ours; the log gets the traceback under a request
    id the body names. The traceback is a field of its own, so every renderer (console,
    JSON, journal) keeps it."""
    request_id = uuid.uuid4().hex[:12]
    log.error("request_failed", request_id=request_id, method=method, path=path,
              code=code, error=f"{type(exc).__name__}: {exc}",
              traceback="".join(traceback.format_exception(exc)))
    return 500, {"code": code, "message": f"{message} (request id {request_id}); the daemon log has the details",
                 "request_id": request_id}


def error_document(exc: Exception, method: str, path: str) -> tuple[int, dict[str, Any]]:
    """The answer to what a handler raised: (status, {"code", "message", ...})."""
    if isinstance(exc, TopodError):
        status = status_of(exc.code)
        if status == 500 and exc.code not in DISK_FAULT_CODES:  # our fault (an unknown code included)
            return fault_document(method, path, exc, exc.code, str(exc))
        # retryable (allocation errors): False when waiting cannot help (more GPUs than the
        # host has, a model it lacks); topoctl exits 1 then, 75 only when a retry may work.
        retry = {"retryable": exc.retryable} if isinstance(getattr(exc, "retryable", None), bool) else {}
        # An error's own numbers (a quota refusal's held, asked, cap): fields beside the message.
        details = getattr(exc, "details", None)
        extra = {k: v for k, v in details.items() if k not in ("code", "message", "retryable")} \
            if isinstance(details, dict) else {}
        return status, {"code": exc.code, "message": str(exc), **retry, **extra}
    if isinstance(exc, PermissionError):  # reading the peer's credentials, or a file the daemon may not touch
        return 403, {"code": "permission_denied", "message": f"permission denied: {exc.strerror or exc}"}
    return fault_document(method, path, exc)


def event_line(record: dict) -> bytes:
    try:
        return json.dumps(record, default=str, allow_nan=False).encode() + b"\n"
    except ValueError:  # a non-finite number: null, as in every response
        return json.dumps(_finite(record), default=str, allow_nan=False).encode() + b"\n"
