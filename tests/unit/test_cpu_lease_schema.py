"""The OpenAPI document and the server agree on leases without GPUs: gpus 0 needs cpus and
asks nothing of GPUs, cpus and near go with gpus 0 only, near's syntax; and the document
still validates as OpenAPI 3.1."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from topod.alloc.errors import InvalidRequestError
from topod.alloc.request import Request
from topod.api.openapi import openapi_document

SCHEMAS = openapi_document()["components"]["schemas"]


def _server_takes(body) -> bool:
    try:
        Request.from_json(body)
    except InvalidRequestError:
        return False
    return True


@pytest.mark.parametrize("body, taken", [
    ({"gpus": 0, "cpus": 2}, True),
    ({"gpus": 0.0, "cpus": 2.0}, True),
    ({"gpus": 0, "cpus": 2, "near": "nvme1"}, True),
    ({"gpus": 0, "cpus": 2, "near": " mlx5_0 "}, True),  # blanks around are stripped
    ({"gpus": 0, "cpus": 2, "near": "81:00.0"}, True),
    ({"gpus": 0, "cpus": 2, "near": "0000:81:00.0"}, True),
    ({"gpus": 0, "cpus": 2, "near": "node:1"}, True),
    ({"gpus": 0, "cpus": 2, "near": None}, True),
    ({"gpus": 0, "cpus": 2, "level": "any", "job": "loader", "priority": 3, "cpus_per_gpu": "auto"}, True),
    ({"gpus": 0, "cpus": 2, "model": None, "min_memory_mib": 0, "gpu_memory_nodes": False, "nics_per_gpu": 0,
      "must_include": []}, True),
    ({"gpus": 0}, False),
    ({"gpus": 0, "cpus": None}, False),
    ({"gpus": 0, "cpus": 0}, False),
    ({"gpus": 0, "cpus": 70000}, False),
    ({"gpus": 0, "cpus": "2"}, False),
    ({"gpus": 1, "cpus": 2}, False),
    ({"gpus": 1, "near": "nvme1"}, False),
    ({"gpus": 1, "near": None}, False),
    ({"gpus": 0, "cpus": 2, "near": "node:"}, False),
    ({"gpus": 0, "cpus": 2, "near": "nvme 1"}, False),
    ({"gpus": 0, "cpus": 2, "near": ""}, False),
    ({"gpus": 0, "cpus": 2, "near": "n" * 65}, False),
    ({"gpus": 0, "cpus": 2, "near": "\tnvme1"}, False),
    ({"gpus": 0, "cpus": 2, "model": "H100"}, False),
    ({"gpus": 0, "cpus": 2, "min_memory_mib": 1}, False),
    ({"gpus": 0, "cpus": 2, "gpu_memory_nodes": True}, False),
    ({"gpus": 0, "cpus": 2, "nics_per_gpu": 1}, False),
    ({"gpus": 0, "cpus": 2, "must_include": [0]}, False),
])
def test_cpu_lease_requests_schema_and_server_agree(body, taken):
    assert Draft202012Validator(SCHEMAS["LeaseRequest"]).is_valid(body) is taken
    assert _server_takes(body) is taken


def test_the_server_says_what_is_wrong_with_a_cpu_lease_request():
    with pytest.raises(InvalidRequestError, match="cpus: required when gpus is 0"):
        Request.from_json({"gpus": 0})
    with pytest.raises(InvalidRequestError, match="near: only for a lease without GPUs"):
        Request.from_json({"gpus": 2, "near": "nvme1"})
    with pytest.raises(InvalidRequestError, match="model: asks about GPUs"):
        Request.from_json({"gpus": 0, "cpus": 1, "model": "H100"})
    assert Request.from_json({"gpus": 0, "cpus": 1, "near": "81:00.0"}).near == "0000:81:00.0"
    assert Request.from_json({"gpus": 0, "cpus": 1, "near": "node:007"}).near == "node:7"


def test_the_document_is_valid_openapi_and_lists_unknown_device():
    openapi_spec_validator = pytest.importorskip("openapi_spec_validator")
    document = openapi_document()
    openapi_spec_validator.validate(document)
    assert "unknown_device" in document["paths"]["/v1/leases"]["post"]["responses"]["400"]["description"]
