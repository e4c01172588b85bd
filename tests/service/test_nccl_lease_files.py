"""A lease's NCCL_TOPO_FILE is readable by the lease's owner and by no other local user
(issue 25, row 9: it sat in the 0700 state directory, which only root can enter, so NCCL
silently ignored it for every non-root owner)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from topod.config import parse_config
from topod.discover import discover
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.service.nccl_files import NcclFiles

OWNER, OTHER = 54321, 54322
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture()
def files(tmp_path):
    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path / "host")
    host = HostRoot(root)
    topology = discover(host, live_nvml=False)
    run = Path(tempfile.mkdtemp(prefix="topod-run-"))  # pytest's own tmp dirs are 0700: no user passes
    os.chmod(run, 0o755)
    config = parse_config("[export]\nwrite_nccl_topology = true\n").with_overrides(
        root=str(root), socket=str(run / "topod.sock"), state_dir=str(run / "state"))
    os.makedirs(run / "state", mode=0o700)
    yield NcclFiles(host, lambda: topology, lambda: config)
    shutil.rmtree(run)


def _lease(files: NcclFiles, uid: int) -> SimpleNamespace:
    no_nics = SimpleNamespace(nics=())
    lease = SimpleNamespace(id="a1b2c3", gpus=(0, 1), cpus=(1, 2), owner_uid=uid, owner_gid=uid, environment={},
                            decision=SimpleNamespace(placements=(no_nics, no_nics)))
    lease.environment = files.lease_environment(lease)
    return lease


def _reads(uid: int, path: str) -> bool:
    return subprocess.run(["cat", path], user=uid, group=uid, capture_output=True).returncode == 0


def test_the_lease_owner_and_no_other_user_reads_the_lease_topology_file(files):
    lease = _lease(files, OWNER)
    files.write_lease(lease)
    path = lease.environment["NCCL_TOPO_FILE"]
    assert _reads(OWNER, path), "the lease's owner cannot read its NCCL_TOPO_FILE"
    assert not _reads(OTHER, path), "another local user can read it"
    found = os.stat(path)
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (OWNER, 0o600)
    user_dir = os.stat(Path(path).parent)
    assert (user_dir.st_uid, stat.S_IMODE(user_dir.st_mode)) == (OWNER, 0o700)
    assert "<system" in Path(path).read_text()
    files.remove_lease(lease)
    assert not Path(path).exists()


def test_a_link_the_owner_plants_is_replaced_not_followed(files, tmp_path):
    lease = _lease(files, OWNER)
    files.write_lease(lease)
    path = Path(lease.environment["NCCL_TOPO_FILE"])
    precious = tmp_path / "precious"
    precious.write_text("root's\n")
    path.unlink()
    path.symlink_to(precious)  # what the owner of the directory could do
    files.write_lease(lease)
    assert precious.read_text() == "root's\n" and os.stat(precious).st_uid == 0
    assert path.is_file() and not path.is_symlink() and os.stat(path).st_uid == OWNER


def test_files_nccl_cannot_build_from_are_said_once_not_per_lease(files):
    # A tree whose /proc/cpuinfo names no CPU: each file's <cpu> lacks the arch NCCL
    # needs (topod.export.nccl); written all the same, and the log says why once.
    from structlog.testing import capture_logs

    (Path(files.host.root) / "proc/cpuinfo").write_text("processor\t: 0\n\n")
    spread = SimpleNamespace(id="d4e5f6", gpus=(0, 4), cpus=(1, 17), owner_uid=OWNER, owner_gid=OWNER,
                             environment={}, decision=SimpleNamespace(placements=(SimpleNamespace(nics=()),) * 2))
    spread.environment = files.lease_environment(spread)
    with capture_logs() as logs:
        files.write_lease(spread)
        files.write_lease(spread)
    said = [entry for entry in logs if entry["event"] == "nccl_topology_incomplete"]
    assert len(said) == 1 and said[0]["code"] == "nccl_cpu_identity_unknown"
    assert said[0]["path"] == spread.environment["NCCL_TOPO_FILE"]
    assert Path(spread.environment["NCCL_TOPO_FILE"]).is_file()
