"""A revoked lease's scope is stopped by the daemon (issue 28; under real systemd in
tests/systemd/test_lease_scope.py). Here, with no systemd on a system bus, revoking still
works and the daemon says once, not per revoke, that it cannot stop jobs' scopes."""

from __future__ import annotations

import os
import time

import pytest


@pytest.mark.skipif(os.path.exists("/run/dbus/system_bus_socket"), reason="this host has a system bus")
def test_revokes_without_a_system_bus_say_once_that_scopes_cannot_be_stopped(daemon_factory):
    daemon = daemon_factory(config='[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    client = daemon.start()
    leases = [client.allocate(1, level="any") for _ in range(3)]
    for lease in leases:  # back to back: their scope stops run concurrently
        client.request("POST", f"/v1/leases/{lease['id']}/revoke")
    assert client.leases() == []
    deadline = time.monotonic() + 5
    while "lease_scopes_unreachable" not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = daemon.log()
    assert log.count('"lease_scopes_unreachable"') == 1, log[-2000:]
    assert "lease_scope_not_stopped" not in log and "lease_scope_stopped" not in log
    assert client.health()["status"] == "ok"
