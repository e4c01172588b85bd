"""GPU caps per uid and per group (pure): [alloc] max_gpus_per_uid and max_gpus_per_group.

A uid may hold at most max_gpus_per_uid GPUs across its live leases; the members of a
group listed in max_gpus_per_group at most that many together. Held = the GPUs of every
lease in the lease table (granted ones count from the grant, before their commit; a
released one stops counting at its release), so a request is judged against what the
same loop step granted before it: the check and the grant are one synchronous step.

A request over a cap is refused with uid_quota or group_quota, its numbers (held, asked,
cap) in the message and as fields. It is retryable only when it fits the cap alone
(asked <= cap): releasing the holder's own leases can make room. A request larger than
the cap never fits.

Who is a group's member: a caller whose process runs with the group's id (its gid as
SO_PEERCRED gives it, the lease's owner_gid), or whose uid the group database lists as a
member (resolved when the config is loaded: topod.config; a membership change counts
from the next reload). A lease counts against every capped group its owner is a member
of, by the same rule.

Root (uid 0) is exempt: it may rewrite these caps and reload, and revoke any lease, so a
cap on it would bound nothing; and a scheduler's prolog that runs as root allocates for
every job on the host. Its leases count against no cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from topod.alloc.errors import GroupQuotaError, QuotaError, UidQuotaError

UNLIMITED = "unlimited"
EXEMPT_UID = 0


@dataclass(frozen=True, slots=True)
class GroupCap:
    name: str
    gid: int
    cap: int
    members: frozenset[int] = frozenset()  # uids the group database lists (at load)

    def covers(self, uid: int, gid: int) -> bool:
        return gid == self.gid or uid in self.members


@dataclass(frozen=True, slots=True)
class GpuQuotas:
    per_uid: int | None = None  # None: unlimited
    groups: tuple[GroupCap, ...] = ()

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> GpuQuotas:
        """From the validated [alloc] section (topod.config): max_gpus_per_uid is
        "unlimited" or a number, max_gpus_per_group GroupCaps."""
        per_uid = settings.get("max_gpus_per_uid", UNLIMITED)
        return cls(None if per_uid == UNLIMITED else int(per_uid), tuple(settings.get("max_gpus_per_group", ())))

    @property
    def unlimited(self) -> bool:
        return self.per_uid is None and not self.groups


# (owner uid, owner gid, GPUs) of one live lease
Holding = tuple[int, int, int]


def quota_refusal(quotas: GpuQuotas, uid: int, gid: int, asked: int,
                  holdings: Iterable[Holding]) -> QuotaError | None:
    """The refusal of `asked` more GPUs for a caller (uid, gid) holding what `holdings`
    says, or None when every cap allows it. Of several caps passed, one the request alone
    exceeds wins (not retryable), then the per-uid cap, then groups by name."""
    if quotas.unlimited or uid == EXEMPT_UID or asked <= 0:  # a lease without GPUs adds none
        return None
    mine = [cap for cap in quotas.groups if cap.covers(uid, gid)]
    if quotas.per_uid is None and not mine:
        return None
    held_by_uid = 0
    held_by_group = dict.fromkeys((cap.name for cap in mine), 0)
    for owner_uid, owner_gid, gpus in holdings:
        if owner_uid == EXEMPT_UID:
            continue
        if owner_uid == uid:
            held_by_uid += gpus
        for cap in mine:
            if cap.covers(owner_uid, owner_gid):
                held_by_group[cap.name] += gpus
    refusals: list[QuotaError] = []
    if quotas.per_uid is not None and held_by_uid + asked > quotas.per_uid:
        refusals.append(_uid_refusal(uid, held_by_uid, asked, quotas.per_uid))
    for cap in mine:
        if held_by_group[cap.name] + asked > cap.cap:
            refusals.append(_group_refusal(cap, uid, held_by_group[cap.name], asked))
    final = [refusal for refusal in refusals if not refusal.retryable]
    return (final or refusals or [None])[0]


def _uid_refusal(uid: int, held: int, asked: int, cap: int) -> UidQuotaError:
    if asked > cap:
        message = (f"uid {uid} asks for {asked} GPU(s); [alloc] max_gpus_per_uid is {cap}: no uid may hold more, "
                   "whatever it releases")
    else:
        smaller = f", or ask for at most {cap - held}" if cap > held else ""
        message = (f"uid {uid} holds {held} GPU(s); {asked} more would pass [alloc] max_gpus_per_uid = {cap} "
                   f"(release {held + asked - cap} of them{smaller})")
    return UidQuotaError(message, held=held, asked=asked, cap=cap, uid=uid)


def _group_refusal(cap: GroupCap, uid: int, held: int, asked: int) -> GroupQuotaError:
    where = f"[alloc] max_gpus_per_group {cap.name!r}"
    if asked > cap.cap:
        message = (f"uid {uid} asks for {asked} GPU(s); {where} is {cap.cap}: its members may not hold more "
                   "together, whatever they release")
    else:
        message = (f"the members of group {cap.name!r} hold {held} GPU(s); {asked} more would pass {where} = "
                   f"{cap.cap} (a member's release of {held + asked - cap.cap} makes room)")
    return GroupQuotaError(message, held=held, asked=asked, cap=cap.cap, group=cap.name, uid=uid)
