"""Request validation: every bad field gets an InvalidRequestError that names it."""

from __future__ import annotations

import pytest

from topod.alloc.errors import InvalidRequestError
from topod.alloc.request import Request


def test_defaults_fill_everything_but_the_count():
    request = Request.from_json({"gpus": 2})
    assert request == Request(gpus=2, must_include=(), level="good", priority=0, cpus_per_gpu=0,
                              min_memory_mib=0, model=None, preemptible=False, job=None)


def test_full_request_round_trips_through_json():
    body = {"gpus": 4, "must_include": [1, "0000:18:00.0"], "level": "best", "priority": -3, "cpus_per_gpu": 6,
            "min_memory_mib": 40000, "model": "H100", "preemptible": True, "job": "train-7", "gpu_memory_nodes": True,
            "nics_per_gpu": 2}
    request = Request.from_json(body)
    assert request.to_json() == body
    assert Request.from_json(request.to_json()) == request


def test_short_pci_address_gets_the_default_domain():
    assert Request.from_json({"gpus": 1, "must_include": ["18:00.0"]}).must_include == ("0000:18:00.0",)


@pytest.mark.parametrize("body, field, words", [
    ({"gpus": 1, "gpu": 2}, "gpu", "unknown field"),
    ({"gpus": 1, "nics_per_gpu": -1}, "nics_per_gpu", ">= 0"),
    ({"gpus": 1, "nics_per_gpu": 17}, "nics_per_gpu", "<= 16"),
    ({"gpus": 1, "nics_per_gpu": "2"}, "nics_per_gpu", "an integer"),
    ({"gpus": 1, "nics_per_gpu": True}, "nics_per_gpu", "an integer"),
    ({}, "gpus", "required"),
    ({"gpus": 0}, "cpus", "required when gpus is 0"),
    ({"gpus": -2}, "gpus", ">= 0"),
    ({"gpus": "2"}, "gpus", "an integer"),
    ({"gpus": True}, "gpus", "an integer"),
    ({"gpus": 2.5}, "gpus", "an integer"),  # 2.0 is the integer 2 (JSON Schema agrees)
    ({"gpus": 100000}, "gpus", "<="),
    ({"gpus": 1, "must_include": 3}, "must_include", "an array"),
    ({"gpus": 1, "must_include": [-1]}, "must_include", ">= 0"),
    ({"gpus": 1, "must_include": [True]}, "must_include", "a boolean"),
    ({"gpus": 1, "must_include": ["card0"]}, "must_include", "neither"),
    ({"gpus": 2, "must_include": [1, 1]}, "must_include", "twice"),
    ({"gpus": 1, "must_include": [1, 2]}, "must_include", "names 2 GPUs"),
    ({"gpus": 1, "level": "great"}, "level", "best, good, any"),
    ({"gpus": 1, "level": 1}, "level", "best, good, any"),
    ({"gpus": 1, "priority": 1.5}, "priority", "an integer"),
    ({"gpus": 1, "cpus_per_gpu": -1}, "cpus_per_gpu", ">= 0"),
    ({"gpus": 1, "cpus_per_gpu": "4"}, "cpus_per_gpu", "an integer"),
    ({"gpus": 1, "min_memory_mib": -5}, "min_memory_mib", ">= 0"),
    ({"gpus": 1, "model": 100}, "model", "a string"),
    ({"gpus": 1, "model": "  "}, "model", "empty"),
    ({"gpus": 1, "preemptible": "yes"}, "preemptible", "true or false"),
    ({"gpus": 1, "job": ["a"]}, "job", "a string"),
    ({"gpus": 1, "job": "x" * 300}, "job", "longer than"),
    ({"gpus": 1, "job": "a\x00b"}, "job", "control character"),
    ({"gpus": 1, "job": "\ud800"}, "job", "lone UTF-16 surrogate"),
    ({"gpus": 1, "model": "H100\x9b"}, "model", "control character"),
    ({"gpus": 1, "must_include": ["18:00.0\x00"]}, "must_include", "control character"),
    ({"gpus": 1, "must_include": [10**400]}, "must_include", "digits"),
])
def test_bad_field_is_named_in_the_error(body, field, words):
    with pytest.raises(InvalidRequestError) as error:
        Request.from_json(body)
    assert error.value.field == field
    assert error.value.code == "invalid_request"
    assert str(error.value).startswith(f"{field}:") and words in str(error.value)
    assert isinstance(error.value, ValueError)


def test_a_body_that_is_not_an_object_is_refused():
    with pytest.raises(InvalidRequestError) as error:
        Request.from_json([{"gpus": 1}])
    assert "JSON object" in str(error.value)
