"""The API's listening socket: taken from systemd (LISTEN_FDS) or bound here."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import structlog
from aiohttp import web

from topod.api.server import routes
from topod.config import Config, parse_listen_address

log = structlog.get_logger("topod")


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


async def serve(daemon, config: Config, listen: socket.socket | None = None) -> web.AppRunner:
    if listen is None:
        listen, where = take_listening_socket(config)
    else:
        where = "pre-bound socket"
    app = routes(daemon)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = web.SockSite(runner, listen)
    await site.start()
    log.info("api_listening", where=where)
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
