"""sd_notify(3): tell systemd the daemon is ready, reloading, stopping, alive.

Without NOTIFY_SOCKET (a terminal, a test, a container) every call is a no-op that
returns False. A failed send never raises: the daemon must not die because systemd
is busy or gone; the last failure is kept in `last_error` for the health report.

We speak the protocol directly instead of through the `sdnotify` package (0.3.2):
it encodes messages as Latin-1, so a STATUS= text with any other character raises
and is silently dropped; it reads os.environ only (no injected environment for
tests); and its bare `except:` hides every failure. The protocol is one datagram of
newline-separated KEY=VALUE lines to a Unix socket; that is all this module does.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Mapping

# EAGAIN: systemd's receive queue is full (it is busy); we never block the event loop
# waiting for it. The others: systemd went away or the socket is not ours to use.
_TRANSIENT = {errno.EAGAIN, errno.ENOBUFS, errno.ECONNREFUSED, errno.ENOENT, errno.EPERM, errno.EACCES}


def notify_address(value: str | None) -> str | bytes | None:
    """NOTIFY_SOCKET -> a socket address, or None when it names no usable Unix socket.

    '/path' is a filesystem socket, '@name' an abstract one ('\\0name' on the wire).
    Other forms (vsock:..., relative paths) are not Unix sockets we can reach: None."""
    if not value:
        return None
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    return None


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares MONOTONIC_USEC with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    """One instance per daemon. `environ` defaults to os.environ (read once, here)."""

    def __init__(self, environ: Mapping[str, str] | None = None, *, unset_environment: bool = False) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET")
        self.address = notify_address(raw)
        self.disabled_reason: str | None = None
        if raw is None:
            self.disabled_reason = "NOTIFY_SOCKET is not set (not started by systemd)"
        elif self.address is None:
            self.disabled_reason = f"NOTIFY_SOCKET={raw!r} is not a Unix socket address"
        self.last_error: str | None = None
        self.sent = 0
        self._sock: socket.socket | None = None
        if unset_environment and environ is None:
            # Children (probe helpers) must not talk to systemd as if they were us.
            os.environ.pop("NOTIFY_SOCKET", None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    # -- the messages the daemon sends ---------------------------------------------
    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *(() if status is None else (_status_line(status),)))

    def status(self, text: str) -> bool:
        return self.send(_status_line(text))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *(() if status is None else (_status_line(status),)))

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd (>= 253, Type=notify-reload) tell this reload
        # from an earlier one; older systemd ignores the extra field.
        return self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}")

    # -- transport ---------------------------------------------------------------
    def send(self, *assignments: str) -> bool:
        """Send KEY=VALUE assignments as one datagram. True when systemd got it."""
        if self.address is None:
            return False
        for line in assignments:
            if "=" not in line or "\n" in line:
                raise ValueError(f"not a single KEY=VALUE notify assignment: {line!r}")
        payload = "\n".join(assignments).encode("utf-8")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL, self.address)
        except OSError as exc:
            self.last_error = f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror or exc}"
            if exc.errno not in _TRANSIENT:
                self.close()  # an unexpected error: start over with a fresh socket next time
            return False
        self.sent += 1
        self.last_error = None
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status_line(text: str) -> str:
    # STATUS= is one line: a multi-line reason (a config error) is folded into one.
    return "STATUS=" + " ".join(text.split())
