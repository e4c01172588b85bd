"""A small client for topod's API, for schedulers and training processes.

Standard library only, and light: HTTP/1.1 is spoken directly over an AF_UNIX socket
(`_socket`, the C module) rather than through http.client, whose import (the email
package) costs more than a whole `topoctl topo --json` answered by the daemon.
"""

from __future__ import annotations

import _socket
import json
import os
from collections.abc import Iterator

from topod.errors import TopodError

TYPE_CHECKING = False  # typing costs ~3 ms at start-up; annotations are never evaluated here
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SOCKET = "/run/topod/topod.sock"
_MAX_HEADER_BYTES = 65536
MAX_WAIT_TIMEOUT_SECONDS = 1e8  # ~3 years: far beyond any [alloc] max_wait_seconds, well within time_t


# What a lease id is (topod.service.lease.new_id writes 16 lowercase hex digits; a
# waiting request's id is 12): topoctl checks a typed id against it before asking.
LEASE_ID_DIGITS = "0123456789abcdef"
LEASE_ID_MAX = 64
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_~")


def is_lease_id(text: str) -> bool:
    return 0 < len(text) <= LEASE_ID_MAX and all(ch in LEASE_ID_DIGITS for ch in text)


def path_segment(text: str) -> str:
    """`text` as one URL path segment: every byte but letters, digits, -, _ and ~
    percent-escaped ('.' too: `..` must not climb to another route, `?` must not start a
    query), so the daemon is asked about exactly what was named."""
    return "".join(chr(byte) if byte in _UNRESERVED else f"%{byte:02X}" for byte in text.encode("utf-8"))


def default_socket() -> str:
    return os.environ.get("TOPOD_SOCKET") or DEFAULT_SOCKET


class ApiError(TopodError):
    def __init__(self, status: int, code: str, message: str, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retryable = retryable  # the daemon's word: False when waiting cannot help


def _retryable(document: Any) -> bool | None:
    value = document.get("retryable") if isinstance(document, dict) else None
    return value if isinstance(value, bool) else None


class _Response:
    """One HTTP response read from a connected socket: status, headers, then the body
    (Content-Length, chunked, or until the server closes)."""

    def __init__(self, sock: Any, where: str) -> None:
        self._sock = sock
        self._where = where
        self._buffer = b""
        self._closed = False
        status_line = self._line()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ApiError(0, "bad_response", f"{where}: not an HTTP response: {status_line[:80]!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        size = len(status_line)
        while True:
            line = self._line()
            size += len(line)
            if size > _MAX_HEADER_BYTES:
                raise ApiError(0, "bad_response", f"{where}: response headers too large")
            if not line.strip():
                break
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        self._remaining = int(length) if length and length.isdigit() and not self._chunked else None
        self._chunk_left = 0

    def _fill(self) -> bool:
        if self._closed:
            return False
        try:
            data = self._sock.recv(65536)
        except OSError as exc:
            raise ApiError(0, "daemon_unreachable", f"{self._where}: {exc.strerror or exc}") from exc
        if not data:
            self._closed = True
            return False
        self._buffer += data
        return True

    def _line(self) -> bytes:
        while b"\n" not in self._buffer:
            if not self._fill():
                line, self._buffer = self._buffer, b""
                if not line:
                    raise ApiError(0, "daemon_unreachable", f"{self._where}: connection closed before a reply")
                return line
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def _take(self, count: int) -> bytes:
        while len(self._buffer) < count and self._fill():
            pass
        data, self._buffer = self._buffer[:count], self._buffer[count:]
        return data

    def read_chunk(self) -> bytes:
        """The next piece of the body; b"" at its end."""
        if self._chunked:
            if self._chunk_left == 0:
                size_line = self._line().split(b";")[0].strip()
                try:
                    self._chunk_left = int(size_line, 16) if size_line else 0
                except ValueError:
                    raise ApiError(0, "bad_response", f"{self._where}: bad chunk size {size_line[:20]!r}") from None
                if self._chunk_left == 0:
                    return b""
            data = self._take(self._chunk_left)
            if not data:
                return b""
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                self._take(2)  # the CRLF after each chunk
            return data
        if self._remaining is not None:
            if self._remaining <= 0:
                return b""
            data = self._take(min(self._remaining, 65536))
            self._remaining -= len(data)
            return data
        if not self._buffer and not self._fill():
            return b""
        data, self._buffer = self._buffer, b""
        return data

    def read(self) -> bytes:
        pieces = []
        while True:
            piece = self.read_chunk()
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)

    def lines(self) -> Iterator[bytes]:
        pending = b""
        while True:
            piece = self.read_chunk()
            if not piece:
                if pending:
                    yield pending
                return
            pending += piece
            while b"\n" in pending:
                line, _, pending = pending.partition(b"\n")
                yield line


class Client:
    def __init__(self, socket_path: str | None = None, timeout: float | None = 60.0) -> None:
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout

    def _open(self, method: str, path: str, payload: bytes | None, timeout: float | None) -> tuple[Any, _Response]:
        where = f"topod at {self.socket_path}"
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            try:
                sock.connect(self.socket_path)
            except PermissionError as exc:
                raise ApiError(0, "permission_denied",
                               f"permission denied on {self.socket_path}: join group topod (sudo usermod -aG topod "
                               "$USER, then log in again) or run as root") from exc
            except OSError as exc:
                raise ApiError(0, "daemon_unreachable",
                               f"cannot reach topod at {self.socket_path}: {exc.strerror or exc}") from exc
            head = [f"{method} {path} HTTP/1.1", "Host: topod", "Connection: close", "Accept: application/json"]
            if payload is not None:
                head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
            try:
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + (payload or b""))
            except OSError as exc:
                raise ApiError(0, "daemon_unreachable", f"{where}: {exc.strerror or exc}") from exc
            return sock, _Response(sock, where)
        except BaseException:
            sock.close()
            raise

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        sock, response = self._open(method, path, payload, timeout if timeout is not None else self.timeout)
        try:
            data = response.read()
        finally:
            sock.close()
        try:
            document = json.loads(data) if data else None
        except ValueError:
            document = None
            if response.status < 400:
                raise ApiError(response.status, "bad_response",
                               f"topod at {self.socket_path}: reply to {method} {path} is not JSON") from None
        if response.status >= 400:
            document = document if isinstance(document, dict) else {}
            raise ApiError(response.status, document.get("code", "http_error"),
                           document.get("message", data.decode("utf-8", "replace")), _retryable(document))
        return document

    def health(self) -> dict:
        return self.request("GET", "/v1/health")

    def topology(self) -> dict:
        return self.request("GET", "/v1/topology")

    def allocate(self, gpus: int, **fields: Any) -> dict:
        wait = float(fields.get("wait") or 0)
        # The daemon answers by its own [alloc] max_wait_seconds; the socket's limit only
        # has to be later, and within what the platform's timers take (1e300 overflows).
        timeout = None if not wait > 0 else min(wait + (self.timeout or 60.0), MAX_WAIT_TIMEOUT_SECONDS)
        return self.request("POST", "/v1/leases", {"gpus": gpus, **fields}, timeout=timeout)

    def leases(self) -> list[dict]:
        return self.request("GET", "/v1/leases")["leases"]

    def lease(self, lease_id: str) -> dict:
        return self.request("GET", f"/v1/leases/{path_segment(lease_id)}")

    def release(self, lease_id: str) -> dict:
        return self.request("DELETE", f"/v1/leases/{path_segment(lease_id)}")

    def revoke(self, lease_id: str) -> dict:
        """Root only: end any lease (403 permission_denied for anyone else)."""
        return self.request("POST", f"/v1/leases/{path_segment(lease_id)}/revoke")

    def place_in_scope(self, lease_id: str, pid: int) -> dict:
        """Put process `pid` in the lease's systemd scope (POST /v1/leases/{id}/scope)."""
        return self.request("POST", f"/v1/leases/{path_segment(lease_id)}/scope", {"pid": pid})

    def renew(self, lease_id: str, ttl_seconds: float | None = None) -> dict:
        body = {} if ttl_seconds is None else {"ttl_seconds": ttl_seconds}
        return self.request("POST", f"/v1/leases/{path_segment(lease_id)}/renew", body)

    def events(self) -> Iterator[dict]:
        """The event stream, one dict per event, until the daemon closes it."""
        sock, response = self._open("GET", "/v1/events", None, None)
        try:
            if response.status >= 400:
                data = response.read()
                try:
                    document = json.loads(data)
                except ValueError:
                    document = {}
                raise ApiError(response.status, document.get("code", "http_error"),
                               document.get("message", data.decode("utf-8", "replace")), _retryable(document))
            for line in response.lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("event") not in ("heartbeat", "subscribed"):
                    yield event
        finally:
            sock.close()


def bind_local_rank(rank: int, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Pin the calling process to the CPUs and memory nodes of its GPU in the lease.

    Reads what `topoctl run` (or a scheduler) put in the environment: TOPOD_GPU_CPUS
    ("gpu:cpulist;...") in the lease's GPU order and TOPOD_GPU_NODES. Rank r takes the
    r-th GPU (modulo the lease size); with TOPOD_GPU_NICS, NCCL_IB_HCA and UCX_NET_DEVICES
    in the environment are narrowed to that GPU's own NICs. Raises TopodError when the
    environment holds no lease.
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
    from topod.pinning import pin_to

    pinned, pinning_warning = pin_to(cpus)
    node = node_of.get(gpu)
    bound = bind_memory([int(node)]) if node not in (None, "") else False
    # The rank sends through its own GPU's NICs (set before NCCL or UCX initialise).
    from topod.alloc.nics import rank_nic_environment

    nics = rank_nic_environment(env.get("TOPOD_GPU_NICS", ""), gpu)
    env.update(nics)
    return {"rank": rank, "gpu": int(gpu), "cpus": cpus, "pinned_cpus": sorted(pinned),
            "pinning_warning": pinning_warning, "memory_node": int(node) if node else None,
            "memory_bound": bound, "nics": nics.get("UCX_NET_DEVICES", "")}
