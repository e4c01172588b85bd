"""A daemon on a captured tree (--root other than /) never writes the host's NCCL file on
the machine it runs on: the default [export] nccl_topology_file
(/var/run/nvidia-topologyd/virtualTopology.xml, which NCCL reads when NCCL_TOPO_FILE is
unset) is skipped with a reason in the log and /v1/health, a path inside the daemon's own
directories (state dir, socket dir) is still written, and each lease still gets its file."""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from topod.config import parse_config
from topod.export import nccl_host
from topod.host import HostRoot
from topod.service.nccl_files import NcclFiles, captured_root_target

DEFAULT_FILE = Path("/var/run/nvidia-topologyd/virtualTopology.xml")


def _host_file_state() -> tuple:
    """What is at NCCL's default path now (absent, or its inode, size and mtime); read only."""
    found = []
    for path in (DEFAULT_FILE.parent, DEFAULT_FILE):
        try:
            st = os.stat(path)
            found.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            found.append(None)
    return tuple(found)


@pytest.fixture()
def writes(monkeypatch) -> list[str]:
    """Every host-file write NcclFiles asks for, recorded and not carried out."""
    asked: list[str] = []
    monkeypatch.setattr(nccl_host, "write_nccl_topology", lambda text, path: asked.append(str(path)))
    return asked


def _files(readonly_host, tmp_path: Path, export: str = "") -> tuple[NcclFiles, Path, Path]:
    host, topology = readonly_host("h800-8gpu")
    state, run = tmp_path / "state", tmp_path / "run"
    config = parse_config(f"[export]\nwrite_nccl_topology = true\n{export}").with_overrides(
        root=str(host.root), socket=str(run / "topod.sock"), state_dir=str(state))
    return NcclFiles(host, lambda: topology, lambda: config), state, run


def test_the_default_host_path_is_skipped_on_a_captured_root_with_a_reason(readonly_host, tmp_path, writes):
    files, state, _ = _files(readonly_host, tmp_path)
    with capture_logs() as logged:
        files.write_host()
        files.write_host()  # said once, not at every topology change
    assert writes == [], "a captured tree's topology was written to the machine's own NCCL file"
    (event,) = [e for e in logged if e["event"] == "nccl_topology_skipped"]
    assert str(DEFAULT_FILE) in event["reason"] and str(state) in event["reason"]
    health = files.health()
    assert health["enabled"] is True and health["host_file"] is None
    assert health["host_file_skipped"] == event["reason"]
    assert health["lease_files"] == str(tmp_path / "run" / "nccl")


def test_the_default_host_path_is_written_on_the_live_host(readonly_host, tmp_path, writes, monkeypatch):
    files, _, _ = _files(readonly_host, tmp_path)
    monkeypatch.setattr(HostRoot, "is_live", property(lambda self: True))
    files.write_host()
    assert writes == [str(DEFAULT_FILE)]
    assert files.health()["host_file"] == str(DEFAULT_FILE) and files.health()["host_file_skipped"] is None


@pytest.mark.parametrize("where", ["state", "run"])
def test_a_path_in_the_daemons_own_directories_is_written_on_a_captured_root(readonly_host, tmp_path, writes, where):
    wanted = tmp_path / where / "nccl-host" / "virtualTopology.xml"
    files, _, _ = _files(readonly_host, tmp_path, f'nccl_topology_file = "{wanted}"\n')
    files.write_host()
    assert writes == [str(wanted)]
    assert files.health()["host_file"] == str(wanted)


def test_a_path_that_leaves_the_state_dir_by_dot_dot_or_a_link_is_skipped(readonly_host, tmp_path, writes):
    (tmp_path / "state").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "state" / "out").symlink_to(tmp_path / "elsewhere")
    for escaping in (tmp_path / "state" / ".." / "elsewhere" / "x.xml", tmp_path / "state" / "out" / "x.xml"):
        files, _, _ = _files(readonly_host, tmp_path, f'nccl_topology_file = "{escaping}"\n')
        files.write_host()
        assert writes == [], escaping
        assert files.health()["host_file"] is None


def test_captured_root_target_keeps_only_paths_strictly_inside_its_own_dirs():
    own = ["/srv/topod/state", "/srv/topod/run"]
    assert captured_root_target("x", "/srv/topod/state/nccl.xml", own).path == "/srv/topod/state/nccl.xml"
    assert captured_root_target("x", "/srv/topod/run/a/b.xml", own).path == "/srv/topod/run/a/b.xml"
    for outside in ("/srv/topod/state", "/srv/topod/statefile.xml", "/var/run/nvidia-topologyd/virtualTopology.xml"):
        skipped = captured_root_target(outside, outside, own)
        assert skipped.path is None and outside in skipped.skipped


def test_nccl_is_reported_disabled_when_not_asked_for(readonly_host, tmp_path, writes):
    host, topology = readonly_host("h800-8gpu")
    config = parse_config("").with_overrides(root=str(host.root), socket=str(tmp_path / "topod.sock"),
                                             state_dir=str(tmp_path / "state"))
    files = NcclFiles(host, lambda: topology, lambda: config)
    files.write_host()
    assert writes == [] and files.health() == {"enabled": False}


def _decided(client) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        nccl = client.health()["nccl"]
        if not nccl.get("enabled") or nccl["host_file_skipped"] != "not decided yet":
            return nccl
        time.sleep(0.05)
    return client.health()["nccl"]


@pytest.mark.parametrize("config", [None, "[export]\nwrite_nccl_topology = true\n"],
                         ids=["defaults", "nccl-files-on"])
def test_a_daemon_on_a_fixture_root_writes_nothing_to_the_machines_nccl_path(daemon_factory, config):
    """Started as users start it: the daemon's own defaults (plus, in the second case, only
    the NCCL files turned on) and --root, --socket, --state-dir."""
    before = _host_file_state()
    daemon = daemon_factory(config=config)
    client = daemon.start()
    lease = client.allocate(2)
    nccl = _decided(client)
    assert _host_file_state() == before, f"{DEFAULT_FILE} (or its directory) changed on this machine"
    if config is None:
        assert nccl == {"enabled": False} and "NCCL_TOPO_FILE" not in lease["environment"]
        return
    assert nccl["host_file"] is None and str(DEFAULT_FILE) in nccl["host_file_skipped"]
    assert "nccl_topology_skipped" in daemon.log()
    per_lease = Path(lease["environment"]["NCCL_TOPO_FILE"])  # where the topology is still found
    assert per_lease.parent.parent == Path(daemon.socket).parent / "nccl"
    assert len(ET.fromstring(per_lease.read_text()).findall(".//gpu")) == 2
    client.release(lease["id"])
    assert _host_file_state() == before
