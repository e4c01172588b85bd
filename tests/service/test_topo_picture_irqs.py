"""The picture of a host served by a dry-run daemon draws where the IRQs are (CPU 0 on a
fresh host) and labels the daemon's placement "planned", never as where they are."""

from __future__ import annotations

import time

from topod.cli.topoctl import main


def test_dry_run_picture_says_where_irqs_are_and_what_is_only_planned(daemon_factory, capsys):
    daemon = daemon_factory()  # [irq] mode = "dry-run": nothing is written
    client = daemon.start()
    deadline = time.monotonic() + 30
    while client.health()["irq"].get("cycles", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert main(["topo", "--socket", daemon.socket, "--root", str(daemon.root), "--format", "dot"]) == 0
    dot = capsys.readouterr().out
    assert "IRQs on → CPU 0" in dot, dot[:2000]
    assert "planned → CPU" in dot
    assert "IRQs → " not in dot
