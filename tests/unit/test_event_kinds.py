"""One list of topod's events: every name the code publishes is in it, `topoctl watch
--event` takes only names from it (a misspelt one is a usage error, not a wait for ever),
and watch prints a list as a list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from topod.event_kinds import EVENT_KINDS

REPO = Path(__file__).resolve().parents[2]
STREAM_CONTROL = {"heartbeat", "subscribed"}  # lines of the stream itself, never events
PUBLISHED = re.compile(r"""publish\(\s*"([a-z_]+)"|"event":\s*"([a-z_]+)"|LinkEvent\(\s*"([a-z_]+)"|"""
                       r"""Event\(\s*"([a-z_]+)"|\.end\(\s*\w+,\s*"([a-z_]+)\"""")


def _published_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "topod").rglob("*.py"):
        for match in PUBLISHED.finditer(path.read_text()):
            names.update(group for group in match.groups() if group)
    return names - STREAM_CONTROL


def test_every_event_the_code_publishes_is_in_the_one_list():
    published = _published_names()
    assert {"lease_granted", "irq_moved", "link_degraded", "config_reloaded"} <= published  # the scan finds them
    assert published <= set(EVENT_KINDS), sorted(published - set(EVENT_KINDS))
    assert len(set(EVENT_KINDS)) == len(EVENT_KINDS)


def test_watch_refuses_an_unknown_event_name_before_asking_the_daemon(tmp_path, capsys):
    from topod.cli.topoctl import main

    with pytest.raises(SystemExit) as usage:
        main(["watch", "--socket", str(tmp_path / "absent.sock"), "--event", "lease_granted", "bogus"])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and "unknown event 'bogus'" in err and "lease_released" in err


def test_watch_prints_every_list_in_brackets():
    from topod.cli.watch_cmd import format_event

    line = format_event({"event": "lease_granted", "lease": "ab", "gpus": [7], "cpus": [1, 2, 33], "uid": 0})
    assert line == "lease_granted lease=ab gpus=[7] cpus=[1,2,33] uid=0"
    assert format_event({"event": "lease_released", "gpus": []}) == "lease_released gpus=[]"
