"""topod.jsonindent.dumps_indented is json.dumps(obj, indent=2), byte for byte, errors
included: the CLI's indented output must not change by going fast."""

from __future__ import annotations

import enum
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topod.jsonindent import dumps_indented

scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
keys = st.text(max_size=8) | st.integers(-5, 5) | st.floats(allow_nan=True) | st.booleans() | st.none()
documents = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=6) | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(keys, inner, max_size=5)),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(documents)
def test_any_plain_document_is_encoded_exactly_as_json_dumps(document):
    assert dumps_indented(document) == json.dumps(document, indent=2)


class Level(enum.IntEnum):
    LOW = 1


class Ratio(float):
    pass


class Name(str):
    pass


@pytest.mark.parametrize("document", [
    {},
    [],
    {"a": [], "b": {}, "c": [[]], "d": [{}]},
    [1, 2, 3],  # the all-int join
    [1, True, 2, None],  # bools are not ints here: true, not 1
    [1, 2.5, -0.0, 1e300, 1e-300],
    {"cpus": list(range(300)), "distances": {str(n): 10 + n for n in range(64)}},
    {"x": "ünïcode \u2028 \x00 \"quoted\" \\ \t"},
    {1: "int key", 2.5: "float key", None: "n"},
    {True: "t", False: "f"},  # apart from 1 and 0: True == 1 would merge the two keys
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, math.inf: "key"},
    (1, (2, (3,))),
    [Level.LOW, Ratio(0.5), Name("sub")],  # subclasses, as json writes them
    {Level.LOW: 1, Name("k"): 2},
    10**100,
    "just a string",
    None,
])
def test_each_edge_of_json_s_format_is_kept(document):
    assert dumps_indented(document) == json.dumps(document, indent=2)


def test_a_value_json_cannot_encode_gets_json_s_own_type_error():
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_indented({"a": [1, {2, 3}]})


def test_a_key_json_cannot_encode_gets_json_s_own_type_error():
    with pytest.raises(TypeError, match="keys must be str"):
        dumps_indented({(1, 2): "tuple key"})


def test_a_circular_document_gets_json_s_value_error_not_a_recursion_error():
    looped: list[object] = [1]
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indented({"loop": looped})


def test_an_integer_too_long_to_print_fails_as_json_fails():
    with pytest.raises(ValueError):
        json.dumps([10**5000], indent=2)
    with pytest.raises(ValueError):
        dumps_indented([10**5000])
