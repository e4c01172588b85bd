"""The OpenAPI document and the server's validators agree (issue 25, row 12): what one
takes the other takes, what one refuses the other refuses, and a repeated JSON key is
refused naming it rather than the last one silently winning."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from topod.alloc.errors import InvalidRequestError
from topod.alloc.request import Request
from topod.api.body import parse_body
from topod.api.openapi import openapi_document
from topod.probe.backend import LinkSyntaxError, parse_link

SCHEMAS = openapi_document()["components"]["schemas"]


def _schema_takes(name: str, value) -> bool:
    return Draft202012Validator(SCHEMAS[name]).is_valid(value)


def _server_takes(value) -> bool:
    try:
        Request.from_json({k: v for k, v in value.items() if k not in ("ttl_seconds", "owner_pid", "wait")})
    except InvalidRequestError:
        return False
    return True


@pytest.mark.parametrize("raw, key", [
    (b'{"gpus": 1, "gpus": 8}', "gpus"),
    (b'{"gpus": 1, "job": "a", "level": "any", "job": "b"}', "job"),
    (b'{"link": "p2p/gpu0/gpu1", "x": {"bytes": 1, "bytes": 2}}', "bytes"),
])
def test_a_repeated_json_key_is_refused_naming_it(raw, key):
    with pytest.raises(InvalidRequestError) as caught:
        parse_body(raw)
    assert caught.value.code == "invalid_request" and caught.value.field == key
    assert "appears twice" in str(caught.value)


def test_distinct_keys_still_parse():
    assert parse_body(b'{"gpus": 1, "job": "a", "x": {"gpus": 2}}') == {"gpus": 1, "job": "a", "x": {"gpus": 2}}


@pytest.mark.parametrize("body, taken", [
    ({"gpus": 1, "job": None}, True),  # null: no label, as when left out; documented nullable
    ({"gpus": 1, "model": None}, True),
    ({"gpus": 1, "job": ""}, False),
    ({"gpus": 1, "job": 5}, False),
    ({"gpus": 2.0}, True),  # JSON Schema's integer: 2.0 is 2
    ({"gpus": 2.5}, False),
    ({"gpus": True}, False),
    ({"gpus": 1, "must_include": [0.0]}, True),
    ({"gpus": 1, "priority": -3.0}, True),
    ({"gpus": 1, "must_include": [" 18:00.0 "]}, True),  # blanks around an address are stripped
    ({"gpus": 1, "must_include": ["\t18:00.0"]}, False),  # a control character never is
    ({"gpus": 1, "level": None}, False),
])
def test_lease_request_schema_and_server_agree(body, taken):
    assert _schema_takes("LeaseRequest", body) is taken
    assert _server_takes(body) is taken


@pytest.mark.parametrize("link", ["p2p/gpu0/gpu1", " H2D / node0 / 0000:18:00.0", "d2h/gpu3/node1",
                                  "mem/node0/node1", "p2p/0000:18:00.0/gpu1", "0", "h2d/gpu0/node0",
                                  "p2p/gpu0", "nvl/gpu0/gpu1", "p2p/18:00.0/gpu1", "\tp2p/gpu0/gpu1"])
def test_telemetry_link_pattern_is_the_parsers_syntax(link):
    body = {"link": link, "bytes": 1, "seconds": 1.0}
    try:
        parse_link(link, {i: f"0000:{0x18 + i:02x}:00.0" for i in range(8)})
        parsed = "\t" not in link  # body.py refuses control characters before the parser sees one
    except LinkSyntaxError:
        parsed = False
    assert _schema_takes("Telemetry", body) is parsed
