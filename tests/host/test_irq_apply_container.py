"""`topoctl irq apply --oneshot` has the daemon's container check: on a root that is a
container (the markers systemd-detect-virt reads) it plans, writes nothing, says so and
exits 1, unless --allow-in-container."""

from __future__ import annotations

import json

import pytest
from irq_helpers import device_irqs, requested

from topod.cli.topoctl import main


@pytest.fixture()
def tree(host_tree):
    return host_tree("vm-nogpu")  # a copy: these tests write its /proc/irq, never the machine's


def _nic_cpus(tree) -> list[list[int]]:  # noqa: ANN001 - Path
    return [requested(tree, irq) for irqs in device_irqs(tree, "nic").values() for irq in irqs]


def _mark(tree, how: str) -> None:  # noqa: ANN001 - Path
    if how == "nspawn":
        (tree / "run" / "systemd").mkdir(parents=True, exist_ok=True)
        (tree / "run" / "systemd" / "container").write_text("systemd-nspawn\n")
    elif how == "docker":
        (tree / ".dockerenv").write_text("")
    elif how == "environ":
        (tree / "proc" / "1").mkdir(parents=True, exist_ok=True)
        (tree / "proc" / "1" / "environ").write_text("PATH=/bin\0container=lxc\0")


@pytest.mark.parametrize(("how", "name"), [("nspawn", "systemd-nspawn"), ("docker", "docker"), ("environ", "lxc")])
def test_apply_in_a_container_plans_and_writes_nothing(tree, capsys, how, name):
    _mark(tree, how)
    before = _nic_cpus(tree)
    assert main(["irq", "apply", "--oneshot", "--root", str(tree), "--socket", str(tree / "none.sock"),
                 "--leased-cpus", "0", "--json"]) == 1
    captured = capsys.readouterr()
    body = json.loads(captured.out)
    assert body["applied"] is False and body["mode"] == "dry-run"
    assert any(e["planned"] and e["planned"] != e["current"] for e in body["irqs"]), "a plan that would move IRQs"
    assert f"is a container ({name})" in body["withheld"] and "--allow-in-container" in body["withheld"]
    notes = [json.loads(line) for line in captured.err.splitlines()]
    assert any(f"is a container ({name})" in n.get("note", "") for n in notes)
    assert _nic_cpus(tree) == before  # nothing written


def test_apply_in_a_container_text_says_why(tree, capsys):
    _mark(tree, "nspawn")
    assert main(["irq", "apply", "--oneshot", "--root", str(tree), "--socket", str(tree / "none.sock")]) == 1
    err = capsys.readouterr().err
    assert f"topoctl: {tree} is a container (systemd-nspawn): IRQ affinity planned, nothing written; " \
           "pass --allow-in-container to write it" in err.splitlines()


def test_allow_in_container_writes(tree, capsys):
    _mark(tree, "nspawn")
    assert main(["irq", "apply", "--oneshot", "--allow-in-container", "--root", str(tree), "--socket",
                 str(tree / "none.sock"), "--leased-cpus", "0", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["applied"] is True and body["moves"] > 0 and "withheld" not in body
    assert sorted(cpus[0] for cpus in _nic_cpus(tree)) == [1, 1, 2, 2, 3]


def test_dry_run_in_a_container_is_not_an_error(tree, capsys):
    _mark(tree, "docker")
    assert main(["irq", "apply", "--oneshot", "--dry-run", "--root", str(tree), "--socket",
                 str(tree / "none.sock"), "--json"]) == 0
    captured = capsys.readouterr()
    body = json.loads(captured.out)
    assert body["applied"] is False and "withheld" not in body
    assert "--allow-in-container" not in captured.err


def test_outside_a_container_apply_writes_as_before(tree, capsys):
    assert main(["irq", "apply", "--oneshot", "--root", str(tree), "--socket", str(tree / "none.sock"),
                 "--leased-cpus", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["applied"] is True
    assert sorted(cpus[0] for cpus in _nic_cpus(tree)) == [1, 1, 2, 2, 3]
