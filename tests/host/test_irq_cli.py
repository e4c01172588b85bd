"""`topoctl irq plan` and `topoctl irq apply --oneshot` on host-tree copies."""

from __future__ import annotations

import json
import pytest
from irq_helpers import device_irqs, requested

from topod.cli.topoctl import main


@pytest.fixture()
def tree(host_tree):
    return host_tree("vm-nogpu")  # small: the CLI discovers the whole tree


def test_plan_json_lists_every_irq_with_its_plan_and_writes_nothing(tree, capsys):
    assert main(["irq", "plan", "--root", str(tree), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["mode"] == "dry-run" and body["moves"] == 0
    (nic,) = device_irqs(tree, "nic")
    entries = {e["irq"]: e for e in body["irqs"]}
    queue0 = entries[device_irqs(tree, "nic")[nic][1]]
    assert queue0["name"].endswith("-TxRx-0") and queue0["device"] == nic and queue0["class"] == "nic"
    assert queue0["planned"] == [0] and queue0["current"] == [0] and queue0["managed"] is False
    assert "spread" in queue0["reason"]
    assert entries[device_irqs(tree, "nic")[nic][2]]["planned"] == [1]
    assert all(requested(tree, irq) == [0] for irq in device_irqs(tree, "nic")[nic])


def test_plan_text_is_a_table_with_reasons(tree, capsys):
    assert main(["irq", "plan", "--root", str(tree), "--leased-cpus", "0-1"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert out.splitlines()[0].startswith(f"root {tree} (")  # the root it read, in the header
    assert out.splitlines()[1] == "[irq] settings from defaults: banned CPUs -, housekeeping CPUs -, irqbalance yield"
    assert out.splitlines()[2].startswith("mode dry-run")
    assert "no daemon at" in captured.err and len(captured.err.splitlines()) == 1
    assert "planning with the defaults" in captured.err
    assert "REASON" in out and "-TxRx-0" in out and "nvme0q1" in out


def test_plan_rejects_a_bad_cpu_list_with_a_clear_error(tree, capsys):
    assert main(["irq", "plan", "--root", str(tree), "--leased-cpus", "3-1"]) == 1
    assert "--leased-cpus" in capsys.readouterr().err


def test_plan_rejects_a_negative_interval_as_a_usage_error(tree, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["irq", "plan", "--root", str(tree), "--interval", "-1"])
    assert stopped.value.code == 2
    assert "--interval: must be from 0 to" in capsys.readouterr().err


def test_apply_needs_oneshot(tree, capsys):
    assert main(["irq", "apply", "--root", str(tree)]) == 1
    assert "--oneshot" in capsys.readouterr().err


def test_apply_oneshot_dry_run_writes_nothing(tree, capsys):
    assert main(["irq", "apply", "--oneshot", "--dry-run", "--root", str(tree), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["applied"] is False
    assert all(requested(tree, irq) == [0] for irqs in device_irqs(tree, "nic").values() for irq in irqs)


def test_apply_oneshot_spreads_the_nic_queues_avoiding_leased_cpus(tree, capsys):
    assert main(["irq", "apply", "--oneshot", "--root", str(tree), "--leased-cpus", "0", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["applied"] is True and body["moves"] > 0
    (irqs,) = device_irqs(tree, "nic").values()
    assert sorted(requested(tree, irq)[0] for irq in irqs) == [1, 1, 2, 2, 3]
