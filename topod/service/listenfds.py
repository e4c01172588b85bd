"""sd_listen_fds(3): the listening sockets systemd hands over (socket activation).

systemd passes LISTEN_FDS consecutive descriptors starting at fd 3, names them in
LISTEN_FDNAMES (colon-separated, from FileDescriptorName=) and sets LISTEN_PID to the
process they are meant for; a child that inherited the environment must not take
them. As in libsystemd, the variables are removed after reading (unset=True) so
that processes we start never see them, and every descriptor becomes close-on-exec.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping

SD_LISTEN_FDS_START = 3
_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def listen_fds(environ: Mapping[str, str] | None = None, unset: bool = True, *,
               pid: int | None = None, first_fd: int = SD_LISTEN_FDS_START) -> dict[str, socket.socket]:
    """{name: socket} for the descriptors systemd passed to this process; {} when none
    were (no LISTEN_PID, or it names another process).

    environ: defaults to os.environ; with unset=True the three variables are removed
    from it (when it is mutable) whatever the outcome. Unnamed descriptors are called
    'unknown', as systemd does; a repeated name gets ':2', ':3'... (a colon cannot occur
    in a name). pid and first_fd exist for tests. Raises ValueError for malformed
    variables or a descriptor that is not a socket: a unit misconfiguration to fix."""
    env = os.environ if environ is None else environ
    values = {key: env.get(key) for key in _VARIABLES}
    if unset and isinstance(env, MutableMapping):
        for key in _VARIABLES:
            env.pop(key, None)
    raw_pid, raw_count, raw_names = values["LISTEN_PID"], values["LISTEN_FDS"], values["LISTEN_FDNAMES"]
    if not raw_pid:
        return {}
    if not raw_pid.isdigit():
        raise ValueError(f"LISTEN_PID={raw_pid!r} is not a process id")
    if int(raw_pid) != (os.getpid() if pid is None else pid):
        return {}
    if raw_count is None or not raw_count.isdigit():
        raise ValueError(f"LISTEN_FDS={raw_count!r} is not a count of descriptors")
    count = int(raw_count)
    if count == 0:
        return {}
    names = _names(raw_names, count)
    sockets: dict[str, socket.socket] = {}
    for offset, name in enumerate(names):
        fd = first_fd + offset
        os.set_inheritable(fd, False)  # FD_CLOEXEC: never leak the API socket to children
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise ValueError(f"descriptor {fd} ({name}) from systemd is not a socket: {exc.strerror}") from None
        sockets[_unique(name, sockets)] = sock
    return sockets


def select_socket(sockets: Mapping[str, socket.socket], name: str = "api") -> socket.socket | None:
    """The listening AF_UNIX stream socket called `name`, else the only one passed;
    None when systemd passed none. Raises ValueError when the choice is ambiguous or
    the socket is of the wrong kind (e.g. ListenDatagram= in the .socket unit)."""
    if not sockets:
        return None
    if name in sockets:
        chosen = sockets[name]
    elif len(sockets) == 1:
        chosen = next(iter(sockets.values()))
    else:
        raise ValueError(f"systemd passed sockets {sorted(sockets)} and none is named {name!r} "
                         f"(FileDescriptorName={name} in topod.socket)")
    if chosen.family != socket.AF_UNIX or chosen.type != socket.SOCK_STREAM:
        raise ValueError(f"socket {name!r} from systemd is {chosen.family.name}/{chosen.type.name}, "
                         "expected a ListenStream= Unix socket")
    if not chosen.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise ValueError(f"socket {name!r} from systemd is not listening (Accept=yes is not supported)")
    return chosen


def _names(raw: str | None, count: int) -> list[str]:
    if raw is None:
        return ["unknown"] * count
    names = raw.split(":")
    if len(names) != count:
        raise ValueError(f"LISTEN_FDNAMES={raw!r} names {len(names)} descriptor(s) but LISTEN_FDS={count}")
    return [n or "unknown" for n in names]


def _unique(name: str, taken: Mapping[str, object]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}:{n}" in taken:
        n += 1
    return f"{name}:{n}"
