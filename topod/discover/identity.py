"""The host's name as the tree records it (exports and multi-host files need it)."""

from __future__ import annotations

from topod.host import HostRoot
from topod.sysnames import is_hostname

HOSTNAME_FILE = "proc/sys/kernel/hostname"


def parse_hostname(text: str | None) -> str | None:
    """The first line, if it is a plausible host name (RFC 1123 letters), else None."""
    if text is None:
        return None
    name = text.strip().splitlines()[0].strip() if text.strip() else ""
    return name if is_hostname(name) else None


def read_hostname(host: HostRoot) -> str | None:
    return parse_hostname(host.read(HOSTNAME_FILE))
