"""Lease.json_text: the lease's JSON text from its decision's parts encoded once, byte for
byte what json.dumps(to_json(), allow_nan=False) gives, for every lease and state."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from topod.service.lease import Lease
from tests.service.lease_store_helpers import make_lease


def _expected(lease: Lease) -> str:
    return json.dumps(lease.to_json(), allow_nan=False)


def test_the_text_is_json_dumps_of_to_json_to_the_byte():
    lease = make_lease("a1", (0, 1))
    assert lease.json_text() == _expected(lease)
    assert json.loads(lease.json_text()) == lease.to_json()


def test_two_leases_of_one_decision_each_get_their_own_fields():
    first = make_lease("a1", (0, 1))
    second = replace(first, id="b2", owner_uid=7, created=2000.5, job=None, confirmed=False,
                     environment={"TOPOD_LEASE": "b2"}, expires=2100.0, ttl_seconds=100.0)
    assert second.decision is first.decision
    assert first.json_text() == _expected(first)
    assert second.json_text() == _expected(second), "the decision's parts from the first, its own fields"
    assert json.loads(second.json_text())["id"] == "b2"


def test_the_same_decision_with_other_uuids_is_encoded_again():
    first = make_lease("a1", (0, 1))
    first.json_text()
    other = replace(first, gpu_uuids=("GPU-x", None))
    assert other.json_text() == _expected(other)
    assert [p["uuid"] for p in json.loads(other.json_text())["placements"]] == ["GPU-x", None]


def test_a_changed_lease_state_shows_at_once():
    lease = make_lease("a1", (3,))
    lease.json_text()
    moved = replace(lease, state="preempting", preempt_deadline=1234.5, missing_gpus=(3,), scope="topod-lease-a1.scope")
    assert moved.json_text() == _expected(moved)


@pytest.mark.parametrize("where", ["created", "satisfaction", "gbps"])
def test_a_number_that_is_not_finite_is_a_value_error_as_json_dumps_and_is_not_kept(where):
    lease = make_lease("n1", (2,))
    if where == "created":
        lease = replace(lease, created=math.nan)
    elif where == "satisfaction":
        lease = replace(lease, decision=replace(lease.decision, satisfaction=math.inf))
    else:
        lease = replace(lease, decision=replace(lease.decision, performance=replace(
            lease.decision.performance, weakest_pair_gbps=math.nan)))
    with pytest.raises(ValueError):
        json.dumps(lease.to_json(), allow_nan=False)
    with pytest.raises(ValueError):
        lease.json_text()
    with pytest.raises(ValueError):
        lease.json_text()  # asked again: still refused, nothing half-kept


def test_many_decisions_keep_a_bounded_memo_and_stay_right():
    from topod.service import lease as module

    leases = [make_lease(f"m{i}", (i % 8,)) for i in range(600)]  # 600 distinct decisions
    for lease in leases:
        assert lease.json_text() == _expected(lease)
    assert len(module._PARTS) <= module._PARTS.kept
