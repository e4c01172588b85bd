"""The NCCL topology files the daemon keeps ([export] write_nccl_topology): the host's,
rewritten when its topology changes, and one per lease restricted to the lease's GPUs
and CPUs, named in its NCCL_TOPO_FILE and removed when it ends. Writes are blocking: the
daemon calls them from worker threads.

The host's file ([export] nccl_topology_file, by default NCCL's own
/var/run/nvidia-topologyd/virtualTopology.xml) belongs to the machine the daemon runs on.
A daemon on a captured tree (--root other than /: a snapshot, a test fixture, someone
trying topod out) describes another machine, so it writes that file only where the path
lies inside its own directories (the state dir or the socket's); anything else is
skipped, said once in the log (nccl_topology_skipped) and in /v1/health `nccl`. It is not
re-rooted under --root: a captured tree is input (a corpus, a snapshot), and its var/run
is commonly a link that would lead back out. The per-lease files are written either way:
they live in the socket's directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from topod.config import Config
from topod.errors import TopodError
from topod.host import HostRoot
from topod.model import Topology
from topod.record import record

log = structlog.get_logger("topod")


@record
class HostFileTarget:
    """Where the host's NCCL file goes: `path`, or None with the reason it is not written."""

    path: str | None
    skipped: str | None = None


def captured_root_target(configured: str, resolved: str, own_dirs: Iterable[str]) -> HostFileTarget:
    """On a captured tree: the path if it lies inside one of the daemon's own directories
    (`resolved` and `own_dirs` given resolved: absolute, no link, no '..' left in them),
    else skipped."""
    dirs = sorted(set(own_dirs))
    if any(_inside(resolved, directory) for directory in dirs):
        return HostFileTarget(resolved)
    return HostFileTarget(None, f"{configured} lies outside the daemon's own directories and its root is a captured "
                                "tree, not this machine: only a daemon on / writes there; set [export] "
                                f"nccl_topology_file to a path under {' or '.join(dirs)} to keep a copy (each "
                                "lease's NCCL_TOPO_FILE is written either way)")


def _inside(path: str, directory: str) -> bool:
    return path != directory and os.path.commonpath([path, directory]) == directory


class NcclFiles:
    def __init__(self, host: HostRoot, topology: Callable[[], Topology], config: Callable[[], Config]) -> None:
        self.host = host
        self._topology = topology
        self._config = config
        self._said: set[str] = set()  # warnings logged already
        self._host: dict[str, object] = {"host_file": None, "host_file_skipped": "not decided yet"}

    def _enabled(self) -> bool:
        return bool(self._config().get("export", "write_nccl_topology"))

    def _write(self, path: str, **subset) -> bool:  # noqa: ANN003 - gpus, cpus
        from topod.export.nccl_host import host_nccl_xml, write_nccl_topology

        try:
            written = host_nccl_xml(self.host, self._topology(), **subset)
            write_nccl_topology(written.text, path=path)
        except (OSError, TopodError, ValueError) as exc:
            log.warning("nccl_topology_not_written", path=path, reason=str(exc))
            return False
        self._say_once(written.warnings, path)
        return True

    def _say_once(self, warnings, path: str) -> None:  # noqa: ANN001 - HostWarning records
        """A file NCCL cannot use (no CPU identity) is said once per reason, not per lease."""
        for warning in warnings:
            if warning.reason not in self._said:
                self._said.add(warning.reason)
                log.warning("nccl_topology_incomplete", path=path, code=warning.code, reason=warning.reason)

    def host_target(self) -> HostFileTarget:
        """Where write_host writes (blocking: resolves links; call from a worker thread)."""
        config = self._config()
        configured = config.get("export", "nccl_topology_file")
        if self.host.is_live:
            return HostFileTarget(configured)
        own = (config.get("daemon", "state_dir"), str(Path(config.get("daemon", "socket")).parent))
        return captured_root_target(configured, os.path.realpath(configured),
                                    [os.path.realpath(directory) for directory in own])

    def write_host(self) -> None:
        if not self._enabled() or not self._topology().gpus:
            return
        target = self.host_target()
        if target.path is None:
            self._host = {"host_file": None, "host_file_skipped": target.skipped}
            if target.skipped not in self._said:
                self._said.add(target.skipped)
                log.warning("nccl_topology_skipped", root=str(self.host.root), reason=target.skipped)
            return
        written = self._write(target.path)
        self._host = {"host_file": target.path, "host_file_skipped": None if written else "write failed (see the log)"}
        if written:
            log.info("nccl_topology_written", path=target.path)

    def health(self) -> dict[str, object]:
        """/v1/health `nccl`: where the host's file goes, or why it is not written (as of the
        last export), and where each lease's file lives."""
        if not self._enabled():
            return {"enabled": False}
        return {"enabled": True, **self._host, "lease_files": str(self.lease_root())}

    def lease_root(self) -> Path:
        """Per-lease files live beside the socket (`<socket dir>/nccl`), not in the 0700
        state directory, which no lease owner but root could enter: the socket's directory
        is one every client reaches. Layout: nccl/ 0711 (root; nobody lists it), nccl/<uid>/
        0700 owned by that user (no other user enters it), <lease>.xml 0600 owned by the
        lease's owner. The daemon writes in a user's directory only through a descriptor
        of it, to a fresh O_EXCL|O_NOFOLLOW name, renamed into place: a link the user puts
        there is replaced, never followed."""
        return Path(self._config().get("daemon", "socket")).parent / "nccl"

    def lease_path(self, lease_id: str, uid: int = 0) -> Path:
        return self.lease_root() / str(uid) / f"{lease_id}.xml"

    def lease_environment(self, lease) -> dict[str, str]:  # noqa: ANN001 - Lease
        if not self._enabled() or not lease.gpus:
            return {}
        return {"NCCL_TOPO_FILE": str(self.lease_path(lease.id, lease.owner_uid))}

    @staticmethod
    def lease_has_files(lease) -> bool:  # noqa: ANN001 - Lease
        return "NCCL_TOPO_FILE" in lease.environment

    def write_lease(self, lease) -> None:  # noqa: ANN001 - Lease
        if not self.lease_has_files(lease):
            return
        from topod.export.nccl_host import host_nccl_xml

        path = lease.environment["NCCL_TOPO_FILE"]
        try:
            nics = sorted({nic.address for placement in lease.decision.placements for nic in placement.nics})
            written = host_nccl_xml(self.host, self._topology(), gpus=list(lease.gpus),
                                    cpus=list(lease.cpus) or None, nics=nics or None)  # a lease with NICs sees only its own
            _write_owned(Path(path), written.text.encode("ascii"), lease.owner_uid, lease.owner_gid)
        except (OSError, TopodError, ValueError) as exc:
            log.warning("nccl_topology_not_written", path=path, reason=str(exc))
            return
        self._say_once(written.warnings, path)

    def remove_lease(self, lease) -> None:  # noqa: ANN001 - Lease
        path = lease.environment.get("NCCL_TOPO_FILE")
        if not path:
            return
        try:
            Path(path).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("lease_file_not_removed", lease=lease.id, reason=str(exc))


def _private_dir(parent_fd: int, name: str, mode: int, uid: int, gid: int) -> int:
    """A descriptor of directory `name` in `parent_fd`, made if missing, never a link,
    owned by uid:gid with `mode`."""
    try:
        os.mkdir(name, mode, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        found = os.fstat(fd)
        if (found.st_uid, found.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
        if stat.S_IMODE(found.st_mode) != mode:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_owned(path: Path, data: bytes, uid: int, gid: int) -> None:
    """`data` as path (root/<uid>/<name>), readable by uid alone; see NcclFiles.lease_root."""
    root = path.parent.parent
    root.mkdir(parents=True, exist_ok=True)
    base = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if os.fstat(base).st_uid != os.geteuid():
            raise OSError(f"{root} is not owned by the daemon's user; not writing lease files in it")
        os.fchmod(base, 0o711)
        user_dir = _private_dir(base, path.parent.name, 0o700, uid, gid)
    finally:
        os.close(base)
    try:
        temp = f".{path.name}.{os.urandom(8).hex()}.tmp"  # secrets.token_hex, without importing hashlib's libcrypto
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=user_dir)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchown(fd, uid, gid)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path.name, src_dir_fd=user_dir, dst_dir_fd=user_dir)
    finally:
        os.close(user_dir)
