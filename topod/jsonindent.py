"""`json.dumps(obj, indent=2)`, byte for byte, without the pure-Python encoder.

With an indent, the standard library gives up its C encoder and walks the document
with nested generators, one `yield` per token: `topoctl topo --json` spent 9 ms of a
65 ms run there on a 256-CPU tree (issue 26). This writer appends each container's
lines to one list and encodes strings with the C escaper json itself uses.

Only plain JSON values take the fast path: dict, list, tuple, str, int, float, bool
and None (subclasses too, encoded as json encodes them). Anything else (an object
json would reject, a circular reference, a nesting deeper than the recursion limit)
is handed to `json.dumps` itself, so the result, or the error, is json's.
"""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring_ascii

_PAD = "  "
_INFINITY = float("inf")
_SEPARATOR = "\x00"
# Exactly these types: a subclass of str or float might not print as json prints it
# through the C encoder, and a dict or list subclass is a container.
_SCALARS = frozenset((str, int, float, bool, type(None)))


def _reject(value: object) -> object:
    raise _NotPlain


# json's C encoder, made once (json.JSONEncoder.encode makes one per call), with a NUL
# between items (see _leaf); it is only given containers of scalars, so no cycle check.
# Without the C speedups (another Python build), every container takes the Python path.
_c_encoder = None if c_make_encoder is None else c_make_encoder(
    None, _reject, encode_basestring_ascii, None, ": ", _SEPARATOR, False, False, True)


def _encode_leaf(value: object) -> str:
    return "".join(_c_encoder(value, 0))  # type: ignore[misc]


class _NotPlain(Exception):
    """The document holds something the fast path does not encode as json would."""


def dumps_indented(obj: object) -> str:
    """`json.dumps(obj, indent=2)` (ensure_ascii, NaN allowed, keys kept in order)."""
    out: list[str] = []
    try:
        _value(obj, out, "\n")
    except (_NotPlain, RecursionError, TypeError, ValueError):
        # json's own answer: the same text, or the same error (a key json rejects, a
        # circular reference, an integer too long to print)
        return json.dumps(obj, indent=2)
    return "".join(out)


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value == _INFINITY:
        return "Infinity"
    if value == -_INFINITY:
        return "-Infinity"
    return float.__repr__(value)


def _scalar(value: object) -> str:
    """The JSON text of a non-container value, as json's encoder writes it."""
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float_text(value)
    raise _NotPlain


def _key(key: object) -> str:
    """A dict key as json writes it: strings as they are, numbers, booleans and None
    as their JSON text, anything else rejected (json's TypeError, via the fallback)."""
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    if isinstance(key, float):
        return encode_basestring_ascii(_float_text(key))
    if key is True:
        return '"true"'
    if key is False:
        return '"false"'
    if key is None:
        return '"null"'
    if isinstance(key, int):
        return encode_basestring_ascii(int.__repr__(key))
    raise _NotPlain


def _value(value: object, out: list[str], newline: str) -> None:
    """Append `value`'s text; `newline` is a line break and the current indent."""
    kind = type(value)
    if kind is dict or (kind is not list and kind is not tuple and isinstance(value, dict)):
        _dict(value, out, newline)  # type: ignore[arg-type]
    elif kind is list or kind is tuple or isinstance(value, (list, tuple)):
        _list(value, out, newline)  # type: ignore[arg-type]
    else:
        out.append(_scalar(value))


def _leaf(compact: str, newline: str) -> str:
    """A container of scalars, from the C encoder's text with NUL item separators: an
    encoded value never holds a raw NUL (strings escape it), so each NUL is a separator."""
    inner = newline + _PAD
    return f"{compact[0]}{inner}{compact[1:-1].replace(_SEPARATOR, ',' + inner)}{newline}{compact[-1]}"


def _dict(value: dict, out: list[str], newline: str) -> None:
    if not value:
        out.append("{}")
        return
    if _c_encoder is not None and _SCALARS.issuperset(map(type, value.values())):  # a NUMA node's distances, a CPU's facts
        out.append(_leaf(_encode_leaf(value), newline))
        return
    inner = newline + _PAD
    parts = []
    for key, item in value.items():
        text = encode_basestring_ascii(key) if type(key) is str else _key(key)
        if type(item) in _SCALARS:
            parts.append(f"{text}: {_scalar(item)}")
        else:
            nested: list[str] = []
            _value(item, nested, inner)
            parts.append(f"{text}: {''.join(nested)}")
    out.append(f"{{{inner}{(',' + inner).join(parts)}{newline}}}")


def _list(value: list | tuple, out: list[str], newline: str) -> None:
    if not value:
        out.append("[]")
        return
    if _c_encoder is not None and _SCALARS.issuperset(map(type, value)):  # CPU lists, matrix rows
        out.append(_leaf(_encode_leaf(value), newline))
        return
    inner = newline + _PAD
    parts = []
    for item in value:
        if type(item) in _SCALARS:
            parts.append(_scalar(item))
        else:
            nested: list[str] = []
            _value(item, nested, inner)
            parts.append("".join(nested))
    out.append(f"[{inner}{(',' + inner).join(parts)}{newline}]")
