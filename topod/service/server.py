"""The API's listening socket, taken from systemd (LISTEN_FDS) or bound here, and the
protocol that serves it within the limits of topod.service.connection_gate:

- a connection beyond the gate's limits gets its 503 and is closed at once (its
  descriptor is freed in the same step: a Unix socket peer still reads what was written
  before the close);
- the daemon's liveness self-check talks over a connection of its own, made at start and
  admitted outside the count, so no flood of clients can fail it;
- a connection that completes no request within `[api] idle_timeout_seconds` (silent,
  half-sent headers, idle keep-alive) is closed;
- a request aiohttp cannot parse (a line over 8,190 bytes, too many headers, a bad
  method, version or chunk, TLS bytes) gets the API's JSON error (400 `invalid_request`)
  and a closed connection; the log says so at most once per 10 s, with a count, never a
  traceback per request;
- a request handler is cancelled when its client disconnects (handler_cancellation).
"""
from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from topod.api.answers import HTTP_CODES, error_response, internal_error
from topod.api.closed_transport import forget_read_callback
from topod.api.half_close import aiohttp_request_in_hand, peer_gone
from topod.api.peer import peer_uid
from topod.api.server import routes
from topod.config import Config, parse_listen_address
from topod.service.connection_gate import (ACCEPT_BATCH, REFUSAL, REFUSAL_LINGER_SECONDS, REFUSALS, ConnectionGate,
                                          asyncio_workers, descriptor_limit, own_descriptors)

log = structlog.get_logger("topod")


# The socket files this process bound (path -> (st_dev, st_ino)): removed at its end only
# while they are still these files, never a socket systemd passed (socket activation).
_BOUND: dict[str, tuple[int, int]] = {}


def remove_bound_sockets() -> None:
    """Remove the socket files this process bound, each only if the path is still ours."""
    for path, identity in list(_BOUND.items()):
        try:
            now = os.lstat(path)
            if (now.st_dev, now.st_ino) == identity:
                os.unlink(path)
        except OSError:
            pass
        _BOUND.pop(path, None)


def bind_unix_socket(path: str, mode: int, gid: int | None) -> socket.socket:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_socket():
        _refuse_if_live(path)
        target.unlink()
    elif target.exists():
        raise OSError(f"{path} exists and is not a socket; refusing to replace it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bind under a umask that leaves no window with a world-writable socket.
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    bound = os.lstat(path)
    _BOUND[path] = (bound.st_dev, bound.st_ino)
    if gid is not None:
        try:
            os.chown(path, -1, gid)
        except PermissionError:
            log.warning("socket_group_not_set", path=path, gid=gid)
    os.chmod(path, mode)
    sock.listen(512)
    return sock


def _refuse_if_live(path: str) -> None:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return  # stale socket from a previous run
    finally:
        probe.close()
    raise OSError(f"another topod is serving {path}")


def take_listening_socket(config: Config) -> tuple[socket.socket, str]:
    from topod.service.listenfds import listen_fds, select_socket

    inherited = listen_fds()
    if inherited:
        sock = select_socket(inherited)
        if sock is None:
            raise OSError(f"socket activation passed {sorted(inherited)} but no listening AF_UNIX stream socket")
        return sock, f"systemd socket activation ({', '.join(sorted(inherited))})"
    from topod.api.peer import group_id

    path = config.get("daemon", "socket")
    sock = bind_unix_socket(path, int(config.get("daemon", "socket_mode"), 8),
                            group_id(config.get("daemon", "group")))
    return sock, path


def _drop_pending_input(transport: asyncio.BaseTransport) -> None:
    """Read and drop what the client already sent, so that the close below is a clean end
    for it rather than a reset (what arrives later cannot be helped in a flood)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        fd = sock.fileno()  # asyncio's sockets are non-blocking: a read never waits
        for _ in range(16):
            if not os.read(fd, 65536):
                return
    except (BlockingIOError, InterruptedError, OSError, ValueError):
        return


class GatedRequestHandler(RequestHandler):
    """aiohttp's connection protocol, counted by a ConnectionGate: one over the limit (or
    over its uid's share) gets a 503 without any of its bytes being parsed, and is closed
    after the client's EOF (at most REFUSAL_LINGER_SECONDS, at most the gate's linger_budget
    such connections at once) or, in a flood, at once: refused connections never hold more
    than a handful of descriptors. An internal connection (the daemon's self-check) is
    admitted outside the count."""

    __slots__ = ("_gate", "_admitted", "_refused", "_uid", "_internal", "_lingering", "half_closed", "_last_payload")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._internal:
            self._admitted = True
            super().connection_made(transport)
            return
        uid = peer_uid(transport)
        if not self._gate.admit(uid):
            self.refuse(transport, uid)
            return
        self._uid = uid
        self._admitted = True  # its count ends with connection_lost
        super().connection_made(transport)

    def refuse(self, transport: asyncio.BaseTransport, uid: int | None) -> None:
        """The gate refused this connection: its 503, then a close after the client's EOF
        (at most REFUSAL_LINGER_SECONDS) or, beyond the gate's linger_budget, at once."""
        self._uid = uid
        self._admitted = False
        why = self._gate.last_refusal[1] if self._gate.last_refusal else "too_many_connections"
        transport.write(REFUSALS.get(why, REFUSAL))  # type: ignore[attr-defined]
        if transport.can_write_eof():  # type: ignore[attr-defined]
            transport.write_eof()  # type: ignore[attr-defined]
        if self._gate.lingering < self._gate.linger_budget:
            self._gate.lingering += 1
            self._lingering = True
            self._refused = transport
            asyncio.get_running_loop().call_later(REFUSAL_LINGER_SECONDS, transport.close)
        else:
            _drop_pending_input(transport)
            transport.close()  # flushes what was written, then frees the descriptor

    def connection_lost(self, exc: BaseException | None) -> None:
        forget_read_callback(self.transport)  # before aiohttp drops it (topod.api.closed_transport)
        if self._lingering:
            self._lingering = False
            self._gate.lingering = max(0, self._gate.lingering - 1)
        if not self._admitted:
            return
        self._admitted = False
        self._last_payload = None
        if not self._internal:
            self._gate.leave(self._uid)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            super().data_received(data)
            if self._messages:  # the body of the last request parsed: whole or not at EOF
                self._last_payload = self._messages[-1][1]

    def eof_received(self) -> bool | None:
        if self._admitted:
            self._drop_abandoned_request()
            if aiohttp_request_in_hand(self, self._last_payload) and not peer_gone(self.transport):
                # Half-closed after a whole request (topod.api.half_close): answered, then
                # closed; open for writing until then. Anything else is a hang-up.
                self.half_closed = True
                if not self._messages:
                    self.close()  # the request in progress is the last
                return True
            return super().eof_received()
        if self._refused is not None:
            self._refused.close()
        return False

    def _drop_abandoned_request(self) -> None:
        """At the client's EOF, a request queued behind a whole one (in progress or queued)
        whose body never all came is one the client abandoned: dropped, so that the whole
        ones before it are answered as a half-closed client's."""
        if not self._messages or self._messages[-1][1].is_eof():
            return
        if len(self._messages) == 1 and self._current_request is None:
            return  # the only request in hand is the partial one: a hang-up
        self._messages.pop()
        self._last_payload = self._messages[-1][1] if self._messages else self._current_request.content

    async def finish_response(self, request: BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        if self.half_closed and not self._messages:
            resp.force_close()  # a half-closed client's last answer: the connection closes after it
        return await super().finish_response(request, resp, start_time)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse, or to a fault outside the
        app's middleware (which answers every handler's own). aiohttp's own logs a
        traceback per request and answers text/plain; this answers the API's JSON error,
        and logs a parse failure as one rate-limited line and a fault as one entry with
        its traceback as a field."""
        if request.writer.output_size > 0:  # part of a response went out: nothing more can
            raise ConnectionError("response already started; cannot send an error response")
        if status >= 500:
            response = internal_error(request, exc if exc is not None else RuntimeError(message or "server fault"))
        else:
            reason = _one_line(message or (str(exc) if exc is not None else "") or "unparsable request")
            self._gate.malformed_request(status, reason)
            response = error_response(HTTP_CODES.get(status, "invalid_request"),
                                      f"malformed HTTP request: {reason}", status)
        response.force_close()
        return response


MALFORMED_REASON_CHARS = 200


def _one_line(text: str) -> str:
    """aiohttp's parse messages span lines (the bad bytes, a caret under them): one line,
    capped, for a log field and a client's message."""
    line = " ".join(text.split())
    return line if len(line) <= MALFORMED_REASON_CHARS else line[:MALFORMED_REASON_CHARS] + "…"


class GatedSockSite(web.SockSite):
    """SockSite whose connections go through a ConnectionGate."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket, gate: ConnectionGate,
                 handler_kwargs: dict[str, Any], backlog: int = 512) -> None:
        super().__init__(runner, sock, backlog=backlog)
        self.gate = gate
        self.handler_kwargs = handler_kwargs

    def _protocol(self, internal: bool = False) -> GatedRequestHandler:
        handler = GatedRequestHandler(self._runner.server, loop=asyncio.get_running_loop(), **self.handler_kwargs)
        handler._gate = self.gate
        handler._admitted = False
        handler._refused = None
        handler._uid = None
        handler._internal = internal
        handler._lingering = False
        handler.half_closed = False
        handler._last_payload = None
        return handler

    async def internal_connection(self) -> socket.socket:
        """A connected socket to this server that no client can crowd out: one end of a
        socketpair served as an accepted connection outside the gate's count (the daemon's
        liveness self-check holds it open, so the check needs no new descriptor)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: self._protocol(internal=True), theirs)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        return ours

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        # asyncio accepts up to `backlog` connections per readiness event before any of
        # their protocols runs: with 512, one burst of a flood took every descriptor
        # (EMFILE) before the gate could refuse and close a single one. Accept in small
        # batches; the kernel's queue keeps its own length (listen() again below).
        self._server = await loop.create_server(self._protocol, sock=self._sock, backlog=ACCEPT_BATCH)
        self._sock.listen(self._backlog)


async def serve(daemon, config: Config, listen: socket.socket | None = None) -> web.AppRunner:
    if listen is None:
        listen, where = take_listening_socket(config)
    else:
        where = "pre-bound socket"
    app = routes(daemon)
    idle = float(config.get("api", "idle_timeout_seconds"))
    # keepalive_timeout: aiohttp arms it when a connection opens and after each response,
    # and closes the connection if no complete request has arrived when it fires.
    # tcp_keepalive: SO_KEEPALIVE means nothing on a Unix socket; a syscall per connection saved.
    handler_kwargs: dict[str, Any] = {"access_log": None, "keepalive_timeout": idle, "tcp_keepalive": False}

    def configured() -> int:
        current = getattr(daemon, "config", None) or config
        return int(current.get("api", "max_connections"))

    def api_int(key: str, default: int) -> int:
        current = getattr(daemon, "config", None) or config
        try:
            return int(current.get("api", key))
        except (KeyError, TypeError, ValueError):
            return default

    own = own_descriptors(gpus=len(daemon.state.topology.gpus), workers=asyncio_workers())
    gate = ConnectionGate(configured, descriptor_limit(), per_uid=lambda: api_int("max_connections_per_uid", 64),
                          root_reserve=lambda: api_int("root_reserved_connections", 16),
                          own_descriptors=sum(own.values()))
    daemon.api_gate = gate
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0, handler_cancellation=True,
                           **handler_kwargs)
    await runner.setup()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(gate.exception_handler(loop.get_exception_handler()))
    site = GatedSockSite(runner, listen, gate, handler_kwargs)
    await site.start()
    daemon.api_site = site
    gate.log_budget()
    log.info("api_listening", where=where, max_connections=gate.ceiling, root_reserved=gate.reserve,
             per_uid=gate.share, idle_timeout_seconds=idle)
    return runner


async def serve_metrics_tcp(daemon, spec: str) -> web.AppRunner:
    """The optional TCP listener: /metrics only, nothing that changes state."""
    host, port = parse_listen_address(spec)

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=daemon.metrics_text().encode())
        response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
        return response

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("metrics_listening", host=host, port=port)
    return runner
