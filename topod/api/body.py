"""The one validation layer for request bodies: bytes in, a JSON value out, or a 4xx.

Every endpoint that takes a body goes through `parse_body`:

- size: at most `max_bytes` (413 `payload_too_large`);
- charset: UTF-8 only. A Content-Type naming another charset is 415
  `unsupported_media_type`; the bytes must then decode strictly as UTF-8 (400
  `invalid_json`). A leading UTF-8 byte order mark is accepted and ignored (RFC 8259 §8.1
  allows it), on every endpoint alike. The media type itself is not checked: `curl -d`
  sends application/x-www-form-urlencoded;
- nesting: at most `MAX_DEPTH` arrays/objects deep, measured on the bytes before
  json.loads runs, so the parser can never recurse into a RecursionError (400
  `invalid_json`);
- numbers: `NaN`, `Infinity`, `-Infinity` are not JSON (400 `invalid_json`); a number
  that overflows a float (1e400) is refused naming its field (400 `invalid_request`);
  an integer literal of more than `MAX_INTEGER_DIGITS` digits is 400 `invalid_json`;
- strings (keys and values): no control characters (C0, DEL, C1), no lone surrogates
  (from `\\ud800` escapes), at most `MAX_STRING_LENGTH` characters (400
  `invalid_request` naming the field);
- keys: each at most once per object (400 `invalid_request` naming the key; json.loads
  would keep the last one silently).

Field-level rules (types, ranges, required fields) stay with the endpoint's own
validator: topod.alloc.request and topod.alloc.service_request for leases, the probe for
telemetry.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

from topod.alloc.errors import InvalidRequestError
from topod.alloc.jsonfields import text_problem
from topod.errors import InvalidJsonError, TopodError

MAX_DEPTH = 32
MAX_STRING_LENGTH = 4096
MAX_INTEGER_DIGITS = 1000
DEFAULT_MAX_BYTES = 1024 * 1024
UTF8_BOM = b"\xef\xbb\xbf"
UTF8_NAMES = frozenset({"utf-8", "utf8"})


class PayloadTooLargeError(TopodError):
    code = "payload_too_large"


class BodyStalledError(TopodError):
    """The client sent part of a body, then nothing for [api] idle_timeout_seconds."""

    code = "request_timeout"


class UnsupportedMediaTypeError(TopodError):
    code = "unsupported_media_type"


# A JSON string literal (escapes included), to blank out before counting brackets.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DELTA = [0] * 256
for _open in b"[{":
    _DELTA[_open] = 1
for _close in b"]}":
    _DELTA[_close] = -1


def nesting_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in a JSON text, brackets inside strings ignored;
    linear time, no recursion, in C but for the final pass over the brackets."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_DELTA.__getitem__, brackets)), default=0)


def check_charset(charset: str | None) -> None:
    if charset is not None and charset.strip().lower() not in UTF8_NAMES:
        raise UnsupportedMediaTypeError(f"request bodies must be UTF-8 JSON; Content-Type names charset "
                                        f"{charset[:40]!r}")


def _refuse_constant(name: str) -> Any:
    raise InvalidJsonError(f"request body is not JSON: {name} is not a JSON number (numbers must be finite)")


def _parse_int(text: str) -> int:
    if len(text) > MAX_INTEGER_DIGITS:
        raise InvalidJsonError(f"request body is not JSON topod takes: an integer of {len(text)} digits "
                               f"(at most {MAX_INTEGER_DIGITS})")
    return int(text)


class _DuplicateKey(Exception):  # noqa: N818 - not a ValueError: json.loads must not wrap it
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (json.loads would keep the last silently)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return value


# One decoder for every body: json.loads with keyword arguments builds a decoder (and its
# C scanner) per call, most of the cost of parsing a small body.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_parse_int,
                            object_pairs_hook=_object_without_duplicates)


def parse_body(raw: bytes, *, charset: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
               optional: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of a request body, or a TopodError with the status it deserves."""
    if len(raw) > max_bytes:
        raise PayloadTooLargeError(f"request body is {len(raw)} bytes; at most {max_bytes} ([api] max_body_bytes)")
    check_charset(charset)
    if raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    try:
        text = raw.decode("utf-8")  # strict: also refuses encoded surrogates and overlongs
    except UnicodeDecodeError as exc:
        raise InvalidJsonError(f"request body is not UTF-8: invalid byte 0x{raw[exc.start]:02x} at offset "
                               f"{exc.start}") from None
    if not text.strip():
        if optional:
            return {}
        raise InvalidJsonError("request body is empty; expected a JSON object")
    # Fewer brackets than the limit cannot nest deeper than it: skip the scan.
    if raw.count(b"[") + raw.count(b"{") > max_depth and (depth := nesting_depth(raw)) > max_depth:
        raise InvalidJsonError(f"request body nests arrays/objects {depth} deep; at most {max_depth}")
    try:
        value = _DECODER.decode(text)
    except _DuplicateKey as exc:
        raise InvalidRequestError(_printable(exc.key), "appears twice in one object; send each field once "
                                                       "(JSON leaves the meaning of a repeated key open)") from None
    except json.JSONDecodeError as exc:
        raise InvalidJsonError(f"request body is not JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # belt and braces: digit limits, the C scanner's own limits
        raise InvalidJsonError(f"request body is not JSON topod takes: {str(exc)[:200]}") from None
    check_value(value)
    return value


def check_value(value: Any, path: str = "") -> None:
    """Refuse non-finite numbers and unstorable strings anywhere in a parsed body; the
    error names the field (`job`, `must_include[2]`). Depth is already bounded."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequestError(path or "body", "number out of range (it overflows a double)")
    elif isinstance(value, str):
        _check_string(value, path or "body")
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{key}" if path else key
            _check_string(key, name)
            check_value(item, name)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_value(item, f"{path}[{index}]" if path else f"[{index}]")


def _check_string(value: str, field: str) -> None:
    if len(value) > MAX_STRING_LENGTH:
        raise InvalidRequestError(_printable(field), f"string longer than {MAX_STRING_LENGTH} characters")
    problem = text_problem(value)
    if problem:
        raise InvalidRequestError(_printable(field), problem)


def _printable(field: str) -> str:
    """A field name fit for an error message (a key may itself be the bad string)."""
    clean = "".join(c if text_problem(c) is None else "?" for c in field[:80])
    return clean + ("…" if len(field) > 80 else "")
