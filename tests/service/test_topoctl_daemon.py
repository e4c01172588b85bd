"""Host-side topoctl commands next to a running daemon on a fixture root: they find it,
check it serves the same root, and use its leases (or refuse to fight it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from topod.cli.topoctl import main
from topod.cpulist import parse_cpulist

REPO = Path(__file__).resolve().parents[2]
CONTINUOUS = '[irq]\nmode = "continuous"\ninterval_seconds = 3600.0\n[probe]\nenabled = false\n'


def _requested(root: Path, irq: int) -> list[int]:
    return parse_cpulist((root / "proc" / "irq" / str(irq) / "smp_affinity_list").read_text().strip())


def _stderr_json(err: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines() if line.strip()]


def _node0_lease(client) -> dict:  # noqa: ANN001 - Client
    lease = client.allocate(4, level="good", cpus_per_gpu=4, ttl_seconds=600, job="t")
    assert lease["gpus"] == [0, 1, 2, 3]
    return lease


def test_irq_plan_and_apply_keep_rdma_irqs_off_the_daemons_leased_cpus(daemon_factory, capsys, tmp_path):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    root = daemon.root
    leased = set(_node0_lease(client)["cpus"])

    # Without the daemon's leases (a socket where no daemon runs) the plan uses those CPUs:
    assert main(["irq", "plan", "--root", str(root), "--json", "--socket", str(tmp_path / "none.sock")]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert any(set(e["planned"] or ()) & leased for e in alone["irqs"] if e["class"] == "rdma")

    # No --root: the daemon's root is adopted and said; its leased CPUs are avoided.
    assert main(["irq", "plan", "--socket", daemon.socket, "--json"]) == 0
    captured = capsys.readouterr()
    (note,) = _stderr_json(captured.err)
    assert note["root"] == str(root) and note["daemon"] is True and note["irq_mode"] == "dry-run"
    plan = json.loads(captured.out)
    rdma = [e for e in plan["irqs"] if e["class"] == "rdma" and e["planned"]]
    assert rdma and not any(set(e["planned"]) & leased for e in rdma)

    # apply --oneshot (the daemon only dry-runs, so it may write): nothing lands on a leased CPU.
    assert main(["irq", "apply", "--oneshot", "--root", str(root), "--socket", daemon.socket, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["applied"] is True and report["moves"] > 0
    for entry in report["irqs"]:
        if entry["class"] == "rdma" and entry["planned"]:
            assert not set(_requested(root, entry["irq"])) & leased, entry


def test_irq_apply_refuses_while_the_daemon_balances_that_root(daemon_factory, capsys):
    daemon = daemon_factory("vm-nogpu", config=CONTINUOUS)
    client = daemon.start()
    root = daemon.root
    # the daemon's own first cycle writes too: compare only after it
    deadline = time.monotonic() + 10
    while client.health()["irq"].get("cycles", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    before: dict = {}
    while time.monotonic() < deadline:  # and until its writes have settled
        now = {p: p.read_text() for p in root.glob("proc/irq/*/smp_affinity_list")}
        if now == before:
            break
        before = now
        time.sleep(0.3)
    assert main(["irq", "apply", "--oneshot", "--root", str(root), "--socket", daemon.socket]) == 1
    err = capsys.readouterr().err
    assert "continuously" in err and "--force" in err
    assert {p: p.read_text() for p in before} == before  # nothing written by topoctl
    # A dry run writes nothing, so it is allowed; --force overrides.
    assert main(["irq", "apply", "--oneshot", "--dry-run", "--root", str(root), "--socket", daemon.socket]) == 0
    assert main(["irq", "apply", "--oneshot", "--force", "--root", str(root), "--socket", daemon.socket]) == 0


def test_exports_and_topo_use_the_daemons_leases(daemon_factory, capsys):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    root = str(daemon.root)
    lease = _node0_lease(client)

    # NRT: node 0's four GPUs are leased, so none is available there; node 1 keeps its four.
    assert main(["export", "nrt", "--socket", daemon.socket, "--node-name", "n1"]) == 0
    captured = capsys.readouterr()
    obj = yaml.safe_load(captured.out)
    available = [next(r["available"] for r in zone["resources"] if r["name"] == "nvidia.com/gpu")
                 for zone in obj["zones"]]
    assert available == [0, 4]
    assert f"root {root}; topod at {daemon.socket} serves it: 1 lease(s)" in captured.err

    # NCCL file of a lease by id, and an unknown lease is exit status 3.
    assert main(["export", "nccl", "--socket", daemon.socket, "--lease", lease["id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == [0, 1, 2, 3]
    assert main(["export", "nccl", "--socket", daemon.socket, "--lease", "nope"]) == 3
    assert "no lease 'nope'" in capsys.readouterr().err

    # topo --json is the daemon's answer (it alone adds leased_gpus); the text marks leases.
    assert main(["--socket", daemon.socket, "topo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["leased_gpus"] == [0, 1, 2, 3] and doc["root"] == root
    # ... and that whole process imports neither discovery nor the model nor http.client.
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "topod.cli.topoctl", "topo", "--json",
                           "--socket", daemon.socket], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["leased_gpus"] == [0, 1, 2, 3]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "topod.client" in imported
    assert not imported & {"topod.discover", "topod.model", "http.client", "dataclasses"}, imported
    assert main(["topo", "--socket", daemon.socket]) == 0
    out = capsys.readouterr().out
    assert out.count(f"(leased: {lease['id']})") == 4
    assert f"daemon: topod at {daemon.socket}: 1 lease(s), GPUs 0-3" in out

    # leases: human times, ISO 8601 in local time with the offset.
    assert main(["leases", "--socket", daemon.socket]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(lease["id"])]
    stamps = re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", row)
    assert len(stamps) == 2, row  # created and expires

    # Exit statuses: no capacity now is 75 (EX_TEMPFAIL); an unknown lease is 3.
    assert main(["allocate", "--socket", daemon.socket, "--gpus", "8"]) == 75
    assert main(["release", "--socket", daemon.socket, "0123456789abcdef"]) == 3
    capsys.readouterr()


def test_a_daemon_serving_another_root_is_not_used(daemon_factory, host_tree, capsys):
    other = host_tree("h800-8gpu")
    daemon = daemon_factory(root=other.parent / "served")
    import shutil

    shutil.copytree(other, daemon.root, symlinks=True)  # the same hardware, another tree
    _node0_lease(daemon.start())
    assert main(["export", "nrt", "--root", str(other), "--socket", daemon.socket, "--node-name", "n", "--json"]) == 0
    captured = capsys.readouterr()
    available = [next(r["available"] for r in zone["resources"] if r["name"] == "nvidia.com/gpu")
                 for zone in json.loads(captured.out)["zones"]]
    assert available == [4, 4]
    (note,) = [line for line in _stderr_json(captured.err) if "daemon" in line]  # the root line
    assert note["daemon"] is False and f"serves {daemon.root}, not {other}" in note["note"]


def test_watch_event_filters_the_stream(daemon_factory):
    daemon = daemon_factory("h800-8gpu")
    client = daemon.start()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    watch = subprocess.Popen([sys.executable, "-m", "topod.cli.topoctl", "watch", "--socket", daemon.socket,
                              "--event", "lease_released", "--count", "1", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        deadline = time.monotonic() + 20
        while watch.poll() is None and time.monotonic() < deadline:  # until the watcher has subscribed
            client.release(client.allocate(1, ttl_seconds=60)["id"])
            time.sleep(0.3)
        out, err = watch.communicate(timeout=10)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["event"] for e in events] == ["lease_released"]  # lease_granted filtered out
