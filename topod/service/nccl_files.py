"""The NCCL topology files the daemon keeps ([export] write_nccl_topology): the host's,
rewritten when its topology changes, and one per lease restricted to the lease's GPUs
and CPUs, named in its NCCL_TOPO_FILE and removed when it ends. Writes are blocking: the
daemon calls them from worker threads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog

from topod.config import Config
from topod.errors import TopodError
from topod.host import HostRoot
from topod.model import Topology

log = structlog.get_logger("topod")


class NcclFiles:
    def __init__(self, host: HostRoot, topology: Callable[[], Topology], config: Callable[[], Config]) -> None:
        self.host = host
        self._topology = topology
        self._config = config

    def _enabled(self) -> bool:
        return bool(self._config().get("export", "write_nccl_topology"))

    def _write(self, path: str, **subset) -> bool:  # noqa: ANN003 - gpus, cpus
        from topod.export.nccl import host_nccl_xml, write_nccl_topology

        try:
            write_nccl_topology(host_nccl_xml(self.host, self._topology(), **subset), path=path)
        except (OSError, TopodError, ValueError) as exc:
            log.warning("nccl_topology_not_written", path=path, reason=str(exc))
            return False
        return True

    def write_host(self) -> None:
        if not self._enabled() or not self._topology().gpus:
            return
        path = self._config().get("export", "nccl_topology_file")
        if self._write(path):
            log.info("nccl_topology_written", path=path)

    def lease_path(self, lease_id: str) -> Path:
        return Path(self._config().get("daemon", "state_dir")) / "nccl" / f"{lease_id}.xml"

    def lease_environment(self, lease) -> dict[str, str]:  # noqa: ANN001 - Lease
        if not self._enabled() or not lease.gpus:
            return {}
        return {"NCCL_TOPO_FILE": str(self.lease_path(lease.id))}

    @staticmethod
    def lease_has_files(lease) -> bool:  # noqa: ANN001 - Lease
        return "NCCL_TOPO_FILE" in lease.environment

    def write_lease(self, lease) -> None:  # noqa: ANN001 - Lease
        if self.lease_has_files(lease):
            self._write(lease.environment["NCCL_TOPO_FILE"], gpus=list(lease.gpus), cpus=list(lease.cpus) or None)

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
