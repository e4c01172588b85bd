"""`json.dumps(obj, indent=2)`, byte for byte, without the pure-Python encoder.

With an indent, the standard library gives up its C encoder and walks the document
with nested generators, one `yield` per token: `topoctl topo --json` spent 9 ms of a
65 ms run there on a 256-CPU tree. This writer joins each container's items
once, hands containers of scalars to json's own C encoder, and escapes strings with the
C escaper json itself uses.

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
    try:
        return _text(obj, "\n")
    except (_NotPlain, RecursionError, TypeError, ValueError):
        # json's own answer: the same text, or the same error (a key json rejects, a
        # circular reference, an integer too long to print)
        return json.dumps(obj, indent=2)


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
    """A dict key as json writes it: a string as it is; a number, a boolean or None as
    its JSON text, quoted; anything else rejected (json's TypeError, via the fallback)."""
    return encode_basestring_ascii(key if isinstance(key, str) else _scalar(key))


def _text(value: object, newline: str) -> str:
    """`value`'s text; `newline` is a line break and the current indent."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        if _c_encoder is not None and _SCALARS.issuperset(map(type, value.values())):  # a NUMA node's distances
            return _leaf(_encode_leaf(value), newline)
        inner = newline + _PAD
        parts = [f"{_key(key)}: {_item(item, inner)}" for key, item in value.items()]
        return f"{{{inner}{(',' + inner).join(parts)}{newline}}}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        if _c_encoder is not None and _SCALARS.issuperset(map(type, value)):  # CPU lists, matrix rows
            return _leaf(_encode_leaf(value), newline)
        inner = newline + _PAD
        return f"[{inner}{(',' + inner).join([_item(item, inner) for item in value])}{newline}]"
    return _scalar(value)


def _item(value: object, newline: str) -> str:
    return _scalar(value) if type(value) in _SCALARS else _text(value, newline)


def _leaf(compact: str, newline: str) -> str:
    """A container of scalars, from the C encoder's text with NUL item separators: an
    encoded value never holds a raw NUL (strings escape it), so each NUL is a separator."""
    inner = newline + _PAD
    return f"{compact[0]}{inner}{compact[1:-1].replace(_SEPARATOR, ',' + inner)}{newline}{compact[-1]}"
