"""A small client for topod's API, for schedulers and training processes.

Standard library only (http.client over AF_UNIX), so it imports fast and works inside
any job's environment.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

from topod.errors import TopodError

DEFAULT_SOCKET = "/run/topod/topod.sock"


def default_socket() -> str:
    return os.environ.get("TOPOD_SOCKET", DEFAULT_SOCKET)


class ApiError(TopodError):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("topod", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError as exc:
            sock.close()
            raise ApiError(0, "daemon_unreachable", f"cannot reach topod at {self.unix_path}: {exc.strerror or exc}") from exc
        self.sock = sock


class Client:
    def __init__(self, socket_path: str | None = None, timeout: float | None = 60.0) -> None:
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        connection = _UnixConnection(self.socket_path, timeout if timeout is not None else self.timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        document = json.loads(data) if data else None
        if response.status >= 400:
            document = document or {}
            raise ApiError(response.status, document.get("code", "http_error"), document.get("message", data.decode()))
        return document

    def health(self) -> dict:
        return self.request("GET", "/v1/health")

    def topology(self) -> dict:
        return self.request("GET", "/v1/topology")

    def allocate(self, gpus: int, **fields: Any) -> dict:
        wait = float(fields.get("wait") or 0)
        return self.request("POST", "/v1/leases", {"gpus": gpus, **fields},
                            timeout=None if wait <= 0 else wait + (self.timeout or 60.0))

    def leases(self) -> list[dict]:
        return self.request("GET", "/v1/leases")["leases"]

    def lease(self, lease_id: str) -> dict:
        return self.request("GET", f"/v1/leases/{lease_id}")

    def release(self, lease_id: str) -> dict:
        return self.request("DELETE", f"/v1/leases/{lease_id}")

    def renew(self, lease_id: str, ttl_seconds: float | None = None) -> dict:
        body = {} if ttl_seconds is None else {"ttl_seconds": ttl_seconds}
        return self.request("POST", f"/v1/leases/{lease_id}/renew", body)

    def events(self) -> Iterator[dict]:
        """The event stream, one dict per event, until the daemon closes it."""
        connection = _UnixConnection(self.socket_path, None)
        try:
            connection.request("GET", "/v1/events")
            response = connection.getresponse()
            while True:
                line = response.readline()
                if not line:
                    return
                event = json.loads(line)
                if event.get("event") not in ("heartbeat", "subscribed"):
                    yield event
        finally:
            connection.close()


def bind_local_rank(rank: int, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Pin the calling process to the CPUs and memory nodes of its GPU in the lease.

    Reads what `topoctl run` (or a scheduler) put in the environment: TOPOD_GPU_CPUS
    ("gpu:cpulist;...") in the lease's GPU order and TOPOD_GPU_NODES. Rank r takes the
    r-th GPU (modulo the lease size). Raises TopodError when the environment holds no lease.
    """
    from topod.cpulist import parse_cpulist
    from topod.membind import bind_memory

    env = os.environ if environ is None else environ
    spec = env.get("TOPOD_GPU_CPUS")
    if not spec:
        raise TopodError("no topod lease in the environment (TOPOD_GPU_CPUS unset); run under `topoctl run`")
    entries = [item.split(":", 1) for item in spec.split(";") if item]
    gpu, cpulist = entries[rank % len(entries)]
    cpus = parse_cpulist(cpulist)
    nodes_spec = env.get("TOPOD_GPU_NODES", "")
    node_of = dict(item.split(":", 1) for item in nodes_spec.split(";") if item)
    os.sched_setaffinity(0, cpus)
    node = node_of.get(gpu)
    bound = bind_memory([int(node)]) if node not in (None, "") else False
    return {"rank": rank, "gpu": int(gpu), "cpus": cpus, "memory_node": int(node) if node else None,
            "memory_bound": bound}
