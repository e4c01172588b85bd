"""`topoctl irq plan` plans with the serving daemon's [irq] settings (GET /v1/irqs
"settings"): CPUs the daemon's config bans get no IRQs from the plan, and the output says
which settings were used; without a daemon, the defaults or --config, said in one line."""

from __future__ import annotations

import json

from topod.cli.topoctl import main
from topod.cpulist import parse_cpulist

BANNED = "0-7,32-39"
DAEMON = f'[irq]\nmode = "dry-run"\nbanned_cpus = "{BANNED}"\nhousekeeping_cpus = "8"\n[probe]\nenabled = false\n'


def _planned(plan: dict, cls: str = "rdma") -> set[int]:
    return {cpu for e in plan["irqs"] if e["class"] == cls and e["planned"] for cpu in e["planned"]}


def _plan(capsys, *argv: str) -> tuple[dict, list[dict]]:
    assert main(["irq", "plan", "--json", *argv]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), [json.loads(line) for line in captured.err.splitlines()]


def test_plan_honours_the_cpus_the_daemons_config_bans(daemon_factory, capsys, tmp_path):
    daemon = daemon_factory("h800-8gpu", config=DAEMON)
    client = daemon.start()
    banned = set(parse_cpulist(BANNED))
    settings = client.request("GET", "/v1/irqs")["settings"]
    assert (settings["banned_cpus"], settings["housekeeping_cpus"], settings["mode"]) == (BANNED, "8", "dry-run")

    # Alone (no daemon answers) the defaults put RDMA IRQs on those CPUs, and say so in one line.
    alone, notes = _plan(capsys, "--root", str(daemon.root), "--socket", str(tmp_path / "none.sock"))
    assert _planned(alone) & banned
    assert alone["settings"]["source"] == "defaults" and alone["settings"]["banned_cpus"] == ""
    (note,) = notes
    assert note["daemon"] is False and "planning with the defaults" in note["note"]

    # With the daemon: its banned CPUs stay clear, and the output says whose settings these are.
    plan, notes = _plan(capsys, "--socket", daemon.socket)
    assert _planned(plan) and not _planned(plan) & banned
    assert plan["settings"]["source"] == "daemon" and plan["settings"]["from"] == f"topod at {daemon.socket}"
    assert plan["settings"]["banned_cpus"] == BANNED and plan["settings"]["housekeeping_cpus"] == "8"
    assert [n["daemon"] for n in notes] == [True]  # one line: the root; no fallback note

    # Text: the settings line names the daemon.
    assert main(["irq", "plan", "--socket", daemon.socket]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line == f"[irq] settings from topod at {daemon.socket}: banned CPUs {BANNED}, housekeeping CPUs 8, " \
                   "irqbalance yield"


def test_plan_follows_the_daemons_reloaded_settings_and_command_line_overrides(daemon_factory, capsys):
    daemon = daemon_factory("h800-8gpu", config=DAEMON)
    client = daemon.start()
    daemon.config_path.write_text(DAEMON.replace(BANNED, "16-23,48-55"))
    assert client.request("POST", "/v1/reload")["applied"] is True
    plan, _ = _plan(capsys, "--socket", daemon.socket)
    assert plan["settings"]["banned_cpus"] == "16-23,48-55"
    assert not _planned(plan) & set(parse_cpulist("16-23,48-55"))
    assert _planned(plan) & set(parse_cpulist(BANNED))  # no longer banned
    # --banned-cpus replaces the daemon's value, and the source says both.
    plan, _ = _plan(capsys, "--socket", daemon.socket, "--banned-cpus", "0-15,32-47")
    assert plan["settings"]["from"] == f"topod at {daemon.socket} and --banned-cpus 0-15,32-47"
    assert not _planned(plan) & set(parse_cpulist("0-15,32-47"))


def test_an_explicit_config_wins_over_the_daemons_and_says_so(daemon_factory, capsys, tmp_path):
    daemon = daemon_factory("h800-8gpu", config=DAEMON)
    daemon.start()
    mine = tmp_path / "mine.toml"
    mine.write_text('[irq]\nbanned_cpus = "1"\n')
    plan, notes = _plan(capsys, "--socket", daemon.socket, "--config", str(mine))
    assert plan["settings"]["source"] == "config" and plan["settings"]["banned_cpus"] == "1"
    assert notes[-1] == {"note": f"[irq] from --config {mine}, not from topod at {daemon.socket}"}


def test_a_daemon_with_irq_off_still_gives_its_settings(daemon_factory, capsys):
    daemon = daemon_factory("h800-8gpu", config=DAEMON.replace('"dry-run"', '"off"'))
    daemon.start()
    plan, _ = _plan(capsys, "--socket", daemon.socket)
    assert plan["settings"]["source"] == "daemon" and plan["settings"]["banned_cpus"] == BANNED
    assert not _planned(plan) & set(parse_cpulist(BANNED))
