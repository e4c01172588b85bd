"""The fields of a lease request the engine does not see (ttl_seconds, owner_pid,
wait), the bounds the config sets on them (RequestLimits) and a renew's body. Its own
module: they are the service's terms for holding a decision, checked against the
running config, where topod.alloc.request holds what the engine decides on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from topod.alloc.errors import InvalidRequestError
from topod.alloc.jsonfields import integral, kind_of, shown

# The kernel's PID_MAX_LIMIT on 64-bit: no pid can be larger, whatever pid_max says.
PID_MAX_LIMIT = 4_194_304

SERVICE_FIELDS = ("ttl_seconds", "owner_pid", "wait")
RENEW_FIELDS = ("ttl_seconds",)


def parse_pid_max(text: str | None) -> int:
    """/proc/sys/kernel/pid_max's text -> the largest pid + 1; PID_MAX_LIMIT when unreadable."""
    try:
        value = int((text or "").strip())
    except ValueError:
        return PID_MAX_LIMIT
    return value if 1 <= value <= PID_MAX_LIMIT else PID_MAX_LIMIT


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The bounds of the fields the engine does not see; the daemon builds them from
    [alloc] max_wait_seconds and renew_max_ttl_seconds."""

    max_wait_seconds: float = 3600.0
    max_ttl_seconds: float = 7 * 24 * 3600.0
    pid_max: int = PID_MAX_LIMIT  # owner_pid is accepted in 1..pid_max (the service reads the host's)

    def __post_init__(self) -> None:
        for name in ("max_wait_seconds", "max_ttl_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"RequestLimits.{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.pid_max, bool) or not isinstance(self.pid_max, int) or self.pid_max < 1:
            raise ValueError(f"RequestLimits.pid_max must be an integer >= 1, got {self.pid_max!r}")


def _seconds(value: Any, name: str, *, positive: bool, maximum: float, limit_name: str) -> float:
    """A finite number of seconds in (0 or [0, maximum]; the error names the field and the limit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(name, f"expected a number of seconds, got {kind_of(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequestError(name, f"must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InvalidRequestError(name, f"must be {'> 0' if positive else '>= 0'}, got {shown(value)}")
    if value > maximum:
        raise InvalidRequestError(name, f"must be <= {maximum:g} seconds ({limit_name}), got {shown(value)}")
    return float(value)


def validate_ttl(value: Any, limits: RequestLimits) -> float:
    return _seconds(value, "ttl_seconds", positive=True, maximum=limits.max_ttl_seconds,
                    limit_name="[alloc] renew_max_ttl_seconds")


def validate_owner_pid(raw: Any, limits: RequestLimits) -> int:
    value = integral(raw)
    if value is None:
        raise InvalidRequestError("owner_pid", f"expected a process id (an integer), got {kind_of(raw)}")
    if value < 1:
        raise InvalidRequestError("owner_pid", f"must be >= 1, got {shown(value)}")
    if value > limits.pid_max:
        raise InvalidRequestError("owner_pid", f"must be <= {limits.pid_max} (the kernel's pid_max), "
                                               f"got {shown(value)}")
    return value


def validate_wait(value: Any, limits: RequestLimits) -> float:
    return _seconds(value, "wait", positive=False, maximum=limits.max_wait_seconds,
                    limit_name="[alloc] max_wait_seconds")


def validate_renew_body(body: Any, limits: RequestLimits) -> float | None:
    """The ttl a renew asks for (finite, > 0, <= limits.max_ttl_seconds), or None for
    `{}` / `{"ttl_seconds": null}`: renew with the lease's own ttl."""
    if not isinstance(body, dict):
        raise InvalidRequestError("body", f"renew takes a JSON object with at most 'ttl_seconds', got {kind_of(body)}")
    unknown = sorted(str(key) for key in body if key not in RENEW_FIELDS)
    if unknown:
        raise InvalidRequestError(unknown[0], "unknown field; renew takes at most 'ttl_seconds'")
    ttl = body.get("ttl_seconds")
    return None if ttl is None else validate_ttl(ttl, limits)


@dataclass(slots=True)
class ServiceRequest:
    """What the engine does not see: ttl, owner process, how long to wait."""

    ttl_seconds: float | None
    owner_pid: int | None
    wait_seconds: float

    @classmethod
    def split(cls, body: Any, limits: RequestLimits | None = None) -> tuple[ServiceRequest, dict[str, Any]]:
        """(the service's fields validated against `limits`, the rest for Request.from_json)."""
        limits = limits if limits is not None else RequestLimits()
        if not isinstance(body, dict):
            raise InvalidRequestError("body", f"must be a JSON object, got {kind_of(body)}")
        engine_body = {k: v for k, v in body.items() if k not in SERVICE_FIELDS}
        ttl = body.get("ttl_seconds")
        owner = body.get("owner_pid")
        wait = body.get("wait")
        return cls(
            None if ttl is None else validate_ttl(ttl, limits),
            None if owner is None else validate_owner_pid(owner, limits),
            0.0 if wait is None else validate_wait(wait, limits),
        ), engine_body
