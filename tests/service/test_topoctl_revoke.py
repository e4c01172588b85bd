"""topoctl revoke: root ends anyone's lease; anyone else is refused (exit 1, the daemon's
reason), and an unknown lease is exit 3 (not found) naming it."""

from __future__ import annotations

import json
import os

import pytest

from topod.cli.topoctl import main


def test_root_revokes_a_lease_with_topoctl(daemon_factory, capsys):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    client = daemon.start()
    lease = client.allocate(2, level="any", job="victim")
    assert main(["--socket", daemon.socket, "revoke", lease["id"]]) == 0
    out = capsys.readouterr().out
    assert out.strip() == f"revoked {lease['id']} (GPUs {lease['gpus']})"
    assert client.leases() == []
    assert '"lease_revoked"' in daemon.log()
    assert main(["--socket", daemon.socket, "--json", "revoke", lease["id"]]) == 3, "gone: not found (README: 3)"
    assert "lease_not_found" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_revoke_is_root_only(daemon_factory, public_socket):
    from tests.service.test_daemon_api import _as_user

    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n[daemon]\nsocket_mode = "0666"\n')
    public_socket(daemon)
    client = daemon.start()
    lease = client.allocate(1, level="any")
    status, out = _as_user(65534, 65534, f"c.revoke({lease['id']!r})", daemon.socket)
    assert json.loads(out) == {"ok": False, "status": 403, "code": "permission_denied"}, out
    assert [item["id"] for item in client.leases()] == [lease["id"]], "the refused revoke changed nothing"
