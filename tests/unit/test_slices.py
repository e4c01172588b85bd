"""Live isolation on cgroup v2 (topod.slices): what is narrowed, the write-ahead record,
what is given back and what is left alone. systemd is two plain functions here (a dict
of units' AllowedCPUs=); the systemd tier asks the real one (tests/systemd/test_slices.py)."""

from __future__ import annotations

import json
import os

from topod.slices import RECORD_NAME, SliceIsolation, plan


class Units:
    """Units' AllowedCPUs= as systemd would hold them, and what was on disk at each set."""

    def __init__(self, state_dir: str, **initial: tuple[int, ...]) -> None:
        self.cpus = {"system.slice": (), "user.slice": (), "init.scope": (), **initial}
        self.state_dir = state_dir
        self.record_at_set: list[dict | None] = []

    def get(self, unit: str) -> tuple[int, ...]:
        return self.cpus[unit]

    def set(self, unit: str, cpus: tuple[int, ...]) -> None:
        path = os.path.join(self.state_dir, RECORD_NAME)
        self.record_at_set.append(json.load(open(path)) if os.path.exists(path) else None)
        self.cpus[unit] = tuple(cpus)


def _isolation(tmp_path, units: Units) -> SliceIsolation:
    return SliceIsolation(str(tmp_path), get=units.get, set_cpus=units.set)


def test_narrowed_with_the_record_on_disk_first_then_given_back(tmp_path):
    units = Units(str(tmp_path), **{"user.slice": (0, 1, 2, 3, 4, 5, 6, 7)})
    isolation = _isolation(tmp_path, units)
    result = isolation.apply((0, 1))
    assert units.cpus == {"system.slice": (0, 1), "user.slice": (0, 1), "init.scope": (0, 1)}
    assert result["narrowed_now"] == ["init.scope", "system.slice", "user.slice"]
    # write-ahead: every set saw the record naming that unit already
    assert all(seen is not None and set(seen["units"]) == {"system.slice", "user.slice", "init.scope"}
               for seen in units.record_at_set)
    assert json.load(open(tmp_path / RECORD_NAME))["units"]["user.slice"] == {"before": "0-7", "set": "0-1"}
    isolation.apply((0, 1, 2))  # a lease ended, another holds on: wider, same "before"
    assert units.cpus["system.slice"] == (0, 1, 2)
    assert json.load(open(tmp_path / RECORD_NAME))["units"]["user.slice"]["before"] == "0-7"
    result = isolation.restore()
    assert units.cpus == {"system.slice": (), "user.slice": (0, 1, 2, 3, 4, 5, 6, 7), "init.scope": ()}
    assert sorted(result["restored_now"]) == ["init.scope", "system.slice", "user.slice"]
    assert not (tmp_path / RECORD_NAME).exists()


def test_a_crash_leaves_the_record_and_the_next_start_gives_it_back(tmp_path):
    units = Units(str(tmp_path))
    _isolation(tmp_path, units).apply((3,))
    after_crash = _isolation(tmp_path, units)  # a new daemon reads what the old one set
    assert set(after_crash.record) == {"system.slice", "user.slice", "init.scope"}
    after_crash.restore()
    assert units.cpus == {"system.slice": (), "user.slice": (), "init.scope": ()}
    assert not (tmp_path / RECORD_NAME).exists()


def test_a_unit_changed_by_someone_else_is_left_as_it_is(tmp_path):
    units = Units(str(tmp_path))
    isolation = _isolation(tmp_path, units)
    isolation.apply((0,))
    units.cpus["user.slice"] = (5,)  # an operator's systemctl set-property since
    assert isolation.apply((0, 1))["left_alone"] == ["user.slice"]
    assert units.cpus["user.slice"] == (5,)
    result = isolation.restore()
    assert result["left_alone"] == ["user.slice"] and units.cpus["user.slice"] == (5,)
    assert units.cpus["system.slice"] == () and not (tmp_path / RECORD_NAME).exists()


def test_a_failed_set_is_kept_in_the_record_and_tried_again(tmp_path):
    units = Units(str(tmp_path))
    isolation = _isolation(tmp_path, units)
    isolation.apply((0,))
    real = units.set

    def refuse(unit, cpus):
        raise OSError("bus gone")

    isolation.set_cpus = refuse
    result = isolation.restore()
    assert set(result["failed"]) == {"system.slice", "user.slice", "init.scope"}
    assert (tmp_path / RECORD_NAME).exists()
    isolation.set_cpus = real
    isolation.restore()
    assert units.cpus["init.scope"] == () and not (tmp_path / RECORD_NAME).exists()


def test_plan_is_pure():
    assert plan({"a": ()}, {}, ()).narrow == {}
    assert plan({"a": ()}, {}, (1,)).narrow == {"a": (1,)}
    assert plan({"a": (1,)}, {"a": {"before": (), "set": (1,)}}, ()).restore == {"a": ()}
