"""A lease's answer text: encoded once, the same text for its database row and its
answers, whether granted or read back at start; a non-finite number is kept in the row
and no strict answer text is made for it (left to the API)."""

from __future__ import annotations

import json

from tests.service.lease_store_helpers import make_lease
from topod.service.lease_store import LeaseStore


def test_a_lease_is_encoded_once_for_its_row_and_its_answer(tmp_path):
    store = LeaseStore(tmp_path)
    lease = make_lease("one", (0, 1))
    store.add(lease)  # no event loop: written before this returns
    answer = store.answer_text(lease)
    row = store.writer._db.execute("SELECT body FROM leases WHERE id = 'one'").fetchone()[0]
    assert answer is not None and answer == row  # the same text, encoded once
    assert json.loads(answer) == store.json_of(lease)
    # another version of the lease (renewed) has its own text; the old object gets none
    from dataclasses import replace

    renewed = replace(lease, expires=2000.0)
    store.update(renewed)
    assert store.answer_text(lease) is None
    assert json.loads(store.answer_text(renewed))["expires"] == 2000.0
    store.close()


def test_a_non_finite_number_is_kept_in_the_row_and_left_to_the_api_to_answer(tmp_path):
    # a NaN can only come from an older state file or a bug; the row keeps what it was
    # given (it reads back the same) and no strict answer text is made for it
    from dataclasses import replace

    store = LeaseStore(tmp_path)
    lease = make_lease("nan", (2,))
    lease = replace(lease, decision=replace(lease.decision, satisfaction=float("nan")))
    store.add(lease)
    assert store.answer_text(lease) is None
    store.close()
    reopened = LeaseStore(tmp_path)
    back = reopened.get("nan")
    assert back is not None and back.decision.satisfaction != back.decision.satisfaction  # NaN, read back
    assert reopened.answer_text(back) is None and reopened.answer_text(back) is None  # asked twice: still None
    reopened.close()


def test_a_lease_read_back_at_start_is_encoded_once_for_all_its_answers(tmp_path):
    store = LeaseStore(tmp_path)
    store.add(make_lease("kept", (3,)))
    store.close()
    reopened = LeaseStore(tmp_path)
    lease = reopened.get("kept")
    first = reopened.answer_text(lease)
    assert first is not None and json.loads(first) == reopened.json_of(lease)
    assert reopened.answer_text(lease) is first  # the same text object: not encoded again
    reopened.close()
