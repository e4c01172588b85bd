"""GPU caps per uid and per group (topod.alloc.quota): who counts, the numbers a refusal
carries and when it is retryable."""

from __future__ import annotations

from topod.alloc.errors import GroupQuotaError, UidQuotaError
from topod.alloc.quota import GpuQuotas, GroupCap, quota_refusal

ALICE, BOB = 1001, 1002
PHYSICS = GroupCap("physics", gid=500, cap=6, members=frozenset({BOB}))


def test_no_cap_refuses_nothing():
    assert quota_refusal(GpuQuotas(), ALICE, 100, 4096, [(ALICE, 100, 8)]) is None


def test_a_uid_over_its_cap_is_refused_with_the_numbers_and_may_retry():
    refusal = quota_refusal(GpuQuotas(per_uid=8), ALICE, 100, 4, [(ALICE, 100, 2), (ALICE, 100, 4), (BOB, 100, 8)])
    assert isinstance(refusal, UidQuotaError) and refusal.code == "uid_quota"
    assert (refusal.held, refusal.asked, refusal.cap) == (6, 4, 8)
    assert refusal.details == {"held": 6, "asked": 4, "cap": 8, "uid": ALICE}
    assert refusal.retryable is True, "releasing its own leases makes room"
    assert "holds 6" in str(refusal) and "max_gpus_per_uid = 8" in str(refusal)
    assert quota_refusal(GpuQuotas(per_uid=8), ALICE, 100, 2, [(ALICE, 100, 6)]) is None, "exactly at the cap"


def test_a_request_larger_than_the_cap_is_never_retryable():
    refusal = quota_refusal(GpuQuotas(per_uid=2), ALICE, 100, 3, [])
    assert isinstance(refusal, UidQuotaError) and refusal.retryable is False
    assert (refusal.held, refusal.asked, refusal.cap) == (0, 3, 2)


def test_root_is_exempt_and_its_leases_count_against_no_one():
    assert quota_refusal(GpuQuotas(per_uid=1, groups=(PHYSICS,)), 0, 0, 8, [(0, 0, 8)]) is None
    assert quota_refusal(GpuQuotas(per_uid=1), ALICE, 500, 1, [(0, 500, 8)]) is None


def test_a_group_counts_its_gid_and_its_listed_members_together():
    quotas = GpuQuotas(groups=(PHYSICS,))
    holdings = [(ALICE, 500, 2),  # runs with the group's gid
                (BOB, 100, 3),  # a listed member, whatever gid it ran with
                (1003, 100, 8)]  # neither
    refusal = quota_refusal(quotas, ALICE, 500, 2, holdings)
    assert isinstance(refusal, GroupQuotaError) and refusal.code == "group_quota"
    assert refusal.details == {"held": 5, "asked": 2, "cap": 6, "group": "physics", "uid": ALICE}
    assert refusal.retryable is True
    assert quota_refusal(quotas, ALICE, 500, 1, holdings) is None
    assert quota_refusal(quotas, 1003, 100, 8, holdings) is None, "not a member: the group's cap is not its"
    assert isinstance(quota_refusal(quotas, BOB, 100, 2, holdings), GroupQuotaError), "a member under another gid"


def test_a_cap_the_request_alone_exceeds_wins_over_one_a_release_could_fix():
    quotas = GpuQuotas(per_uid=8, groups=(GroupCap("students", 600, 2),))
    refusal = quota_refusal(quotas, ALICE, 600, 3, [(ALICE, 600, 6)])
    assert isinstance(refusal, GroupQuotaError) and refusal.retryable is False
    refusal = quota_refusal(GpuQuotas(per_uid=8, groups=(GroupCap("students", 600, 20),)), ALICE, 600, 3,
                            [(ALICE, 600, 6)])
    assert isinstance(refusal, UidQuotaError) and refusal.retryable is True


def test_quotas_come_from_the_validated_alloc_section():
    assert GpuQuotas.from_settings({"max_gpus_per_uid": "unlimited", "max_gpus_per_group": ()}).unlimited
    quotas = GpuQuotas.from_settings({"max_gpus_per_uid": 4, "max_gpus_per_group": (PHYSICS,)})
    assert (quotas.per_uid, quotas.groups) == (4, (PHYSICS,))
    assert GpuQuotas.from_settings({}).unlimited, "a settings dict from before the caps: unlimited"


def test_a_lease_without_gpus_is_never_refused_by_a_gpu_cap():
    assert quota_refusal(GpuQuotas(per_uid=2, groups=(PHYSICS,)), BOB, 500, 0, [(BOB, 500, 8)]) is None
