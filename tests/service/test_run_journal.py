"""topoctl run --journal where no journald runs (this machine): a clear error before any
lease is taken, and the command never runs. With journald: tests/systemd/test_scope_api.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from topod.journalstream import JOURNAL_STDOUT


@pytest.mark.skipif(os.path.exists(JOURNAL_STDOUT), reason="this host runs journald")
def test_run_journal_without_journald_says_so_and_takes_no_lease(daemon_factory, tmp_path):
    daemon = daemon_factory()
    client = daemon.start()
    marker = tmp_path / "ran"
    env = dict(os.environ, TOPOD_SOCKET=daemon.socket, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "run", "--journal", "--gpus", "1", "--",
                           "touch", str(marker)], env=env, timeout=60, capture_output=True, text=True)
    assert done.returncode == 1, done
    assert f"--journal: no journald stream socket at {JOURNAL_STDOUT}" in done.stderr
    assert not marker.exists()
    assert client.leases() == []
    assert "lease_granted" not in daemon.log()
