"""Live isolation of leased cores on cgroup v2 (`[isolate] system = true`, method cgroup).

Where systemd holds cpusets (topod.enforce: host mode cgroup), everything that is not a
lease's job runs under system.slice, user.slice or init.scope; while leases hold CPUs,
those three get the runtime property AllowedCPUs= = the housekeeping CPUs (the host's
CPUs no lease holds), through SetUnitProperties(runtime=true): nothing is written to
/etc, and a reboot forgets it. Lease scopes (topod-lease-<id>.scope) sit in their own
slice's tree and keep their own AllowedCPUs=.

As in the affinity mode (topod.isolate), what is changed is recorded in the state
directory *before* it is changed (each unit's AllowedCPUs= before, and what topod set),
so it is given back when the last lease ends, on stop, and at the next start after a
crash. A unit whose AllowedCPUs= was changed by someone else since is left as it is,
and said.

`plan` is pure; `SliceIsolation` keeps the record and reaches systemd through two
injectable calls (topod.scope's D-Bus client in the daemon).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from topod.cpulist import format_cpulist, parse_cpulist
from topod.staterecord import load_record, save_record

UNITS = ("system.slice", "user.slice", "init.scope")
RECORD_NAME = "isolation-slices.json"


@dataclass(slots=True)
class SlicePlan:
    narrow: dict[str, tuple[int, ...]] = field(default_factory=dict)  # unit -> AllowedCPUs to set now
    restore: dict[str, tuple[int, ...]] = field(default_factory=dict)  # unit -> its AllowedCPUs before
    left: list[str] = field(default_factory=list)  # changed by someone else since: left as it is


def plan(current: dict[str, tuple[int, ...]], record: dict[str, dict[str, tuple[int, ...]]],
         housekeeping: tuple[int, ...]) -> SlicePlan:
    """current: each unit's AllowedCPUs= now (() = no restriction); record: what topod set
    ({"before", "set"}); housekeeping: the CPUs to allow, () to give everything back."""
    result = SlicePlan()
    for unit, now in current.items():
        old = record.get(unit)
        if not housekeeping:
            if old is None:
                continue
            if now == old["set"]:
                result.restore[unit] = old["before"]
            else:
                result.left.append(unit)
            continue
        if old is not None and now != old["set"]:
            result.left.append(unit)  # someone set it since: theirs now
            continue
        if now != housekeeping:
            result.narrow[unit] = housekeeping
    return result


class SliceIsolation:
    def __init__(self, state_dir: str, *, get: Callable[[str], tuple[int, ...]] | None = None,
                 set_cpus: Callable[[str, tuple[int, ...]], None] | None = None,
                 units: Iterable[str] = UNITS) -> None:
        from topod import scope

        self.path = os.path.join(state_dir, RECORD_NAME)
        self.get = get or scope.unit_allowed_cpus
        self.set_cpus = set_cpus or scope.set_allowed_cpus
        self.units = tuple(units)
        self.record: dict[str, dict[str, tuple[int, ...]]] = self._load()
        self.last: dict = {"active": False}

    # -- the record --------------------------------------------------------------------
    def _load(self) -> dict[str, dict[str, tuple[int, ...]]]:
        try:
            body = load_record(self.path)
            if body is None:
                return {}
            return {unit: {"before": tuple(parse_cpulist(entry["before"])), "set": tuple(parse_cpulist(entry["set"]))}
                    for unit, entry in body["units"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _save(self) -> None:
        units = {unit: {"before": format_cpulist(entry["before"]), "set": format_cpulist(entry["set"])}
                 for unit, entry in self.record.items()}
        save_record(self.path, {"version": 1, "units": units} if units else None)

    # -- acting (blocking: run in a worker thread) ---------------------------------------
    def apply(self, housekeeping: Iterable[int]) -> dict:
        """Narrow the units to `housekeeping` (empty: give back what topod set)."""
        target = tuple(sorted(set(housekeeping)))
        current = {unit: tuple(self.get(unit)) for unit in self.units}
        result = plan(current, self.record, target)
        for unit, cpus in result.narrow.items():
            self.record[unit] = {"before": self.record.get(unit, {}).get("before", current[unit]), "set": cpus}
        if result.narrow:
            self._save()  # write-ahead: on disk before systemd is asked
        failed = {}
        for unit, cpus in result.narrow.items():
            try:
                self.set_cpus(unit, cpus)
            except Exception as exc:  # noqa: BLE001 - said; the record keeps what may have happened
                failed[unit] = str(exc)
        restored = []
        for unit, before in result.restore.items():
            try:
                self.set_cpus(unit, before)
            except Exception as exc:  # noqa: BLE001 - kept in the record: tried again
                failed[unit] = str(exc)
                continue
            self.record.pop(unit, None)
            restored.append(unit)
        for unit in result.left:
            if not target:
                self.record.pop(unit, None)
        if result.restore or result.left:
            self._save()
        self.last = {"active": bool(target), "housekeeping_cpus": format_cpulist(target),
                     "units": {unit: format_cpulist(entry["set"]) for unit, entry in self.record.items()},
                     "narrowed_now": sorted(set(result.narrow) - set(failed)), "restored_now": restored,
                     "left_alone": sorted(result.left), "failed": failed}
        return self.last

    def restore(self) -> dict:
        return self.apply(())
