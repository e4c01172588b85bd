"""How one field of a JSON body is judged: JSON's integers (integral), bounded
integers, clean text (text_problem), and the words an error uses for what was sent
(kind_of, shown). Its own module: the engine's request (topod.alloc.request), the
service's fields (topod.alloc.service_request), the body parser (topod.api.body), lease
scopes and telemetry all judge a field the same way, and none of them need the
others' values to do it."""

from __future__ import annotations

import math
import re
from typing import Any

from topod.alloc.errors import InvalidRequestError

# C0 controls, DEL, C1 controls and UTF-16 surrogates (a lone one cannot be encoded as
# UTF-8: a job name carrying one would crash every client that prints it).
FORBIDDEN_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def integral(value: Any) -> int | None:
    """A JSON integer as an int, or None. 3.0 is the integer 3 (JSON Schema's "integer"
    and JSON's own number model say so); true is not 1, 3.5 is not an integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def integer_field(body: dict, name: str, *, default: int | None = None, minimum: int, maximum: int) -> int:
    raw = body.get(name, default)
    value = integral(raw)
    if value is None:
        raise InvalidRequestError(name, f"expected an integer, got {kind_of(raw)}")
    if value < minimum:
        raise InvalidRequestError(name, f"must be >= {minimum}, got {shown(value)}")
    if value > maximum:
        raise InvalidRequestError(name, f"must be <= {maximum}, got {shown(value)}")
    return value


def shown(value: Any) -> str:
    """A number for an error message: a 400-digit integer is not worth echoing."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"an integer of {len(str(abs(value))) if abs(value) < 10**4000 else 'thousands of'} digits"
    return repr(value)


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored and shown, or None: control characters (NUL, C0,
    DEL, C1) and lone surrogates are refused everywhere in the API."""
    bad = FORBIDDEN_CHARACTERS.search(value)
    if bad is None:
        return None
    char = bad.group()
    what = "a lone UTF-16 surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
    return f"contains {what} (U+{ord(char):04X}) at position {bad.start()}"


def text_field(body: dict, name: str, limit: int) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(name, f"expected a string, got {kind_of(value)}")
    problem = text_problem(value)
    if problem:
        raise InvalidRequestError(name, problem)
    value = value.strip()
    if not value:
        raise InvalidRequestError(name, "must not be empty")
    if len(value) > limit:
        raise InvalidRequestError(name, f"longer than {limit} characters")
    return value
