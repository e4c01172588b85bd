"""A job's stdout/stderr into the journal, as systemd connects a service's (StandardOutput=journal).

journald takes streams on /run/systemd/journal/stdout: a client connects, sends a header
of seven lines (identifier, unit id, priority, level prefix, forward to syslog, to kmsg,
to the console), then its output, one entry per line. journald labels the entries from
the connecting process (SO_PEERCRED, then its cgroup), so a job that connects from inside
its lease's scope is found by `journalctl -u topod-lease-<id>.scope`.

`header` is pure; `connect` is the one socket call, given a path so tests can stand a
listener in journald's place.
"""

from __future__ import annotations

import os
import socket

JOURNAL_STDOUT = "/run/systemd/journal/stdout"
PRIORITY_INFO = 6  # stdout, as systemd's default for services
PRIORITY_ERR = 3  # stderr


class NoJournalError(OSError):
    """No journald takes streams here."""


def header(identifier: str, unit: str, priority: int) -> bytes:
    """The stream header: the output is kept as written (no <N> level prefixes read) and
    forwarded nowhere beyond what journald's own configuration says."""
    fields = (identifier, unit, str(priority), "0", "0", "0", "0")
    if any("\n" in field for field in fields):
        raise ValueError("a journal stream header field cannot hold a newline")
    return "".join(f"{field}\n" for field in fields).encode()


def connect(identifier: str, unit: str, priority: int, path: str = JOURNAL_STDOUT) -> int:
    """A file descriptor that writes into the journal (the caller dup2()s it onto 1 or 2)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        sock.shutdown(socket.SHUT_RD)  # journald never writes back
        sock.sendall(header(identifier, unit, priority))
    except OSError as exc:
        sock.close()
        raise NoJournalError(exc.errno, f"no journald stream socket at {path} ({exc.strerror or exc}): "
                                        "is systemd-journald running?") from None
    return sock.detach()


def redirect(identifier: str, unit: str, path: str = JOURNAL_STDOUT) -> None:
    """This process's stdout (priority info) and stderr (err) into the journal."""
    for target, priority in ((1, PRIORITY_INFO), (2, PRIORITY_ERR)):
        fd = connect(identifier, unit, priority, path)
        os.dup2(fd, target)
        os.close(fd)


def check(path: str = JOURNAL_STDOUT) -> None:
    """NoJournalError unless journald takes streams at `path` (asked before a lease is taken)."""
    os.close(connect("topoctl", "", PRIORITY_INFO, path))
