"""sd_listen_fds: sockets handed over by systemd socket activation."""

from __future__ import annotations

import os
import socket

SD_LISTEN_FDS_START = 3


def listen_fds(environ=None, unset: bool = True) -> dict[str, socket.socket]:
    env = os.environ if environ is None else environ
    pid, count = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    if not pid or not count or not pid.isdigit() or int(pid) != os.getpid() or not count.isdigit():
        return {}
    names = (env.get("LISTEN_FDNAMES") or "").split(":")
    sockets: dict[str, socket.socket] = {}
    for offset in range(int(count)):
        fd = SD_LISTEN_FDS_START + offset
        os.set_inheritable(fd, False)
        name = names[offset] if offset < len(names) and names[offset] else f"fd{fd}"
        sockets[name] = socket.socket(fileno=fd)
    if unset and environ is None:
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(key, None)
    return sockets
