"""Which root a host-side command reads, and the daemon that serves it (if any).

A host-side command (topo, irq, export, doctor, links) finds the daemon as the lease
commands do (`--socket`, `$TOPOD_SOCKET`, the default socket). When it answers and serves
the same root (real paths compared; without `--root` the command adopts the daemon's
root), its leases count: leased CPUs for IRQ planning, leased GPUs as unavailable, and so
on. When none answers, the command says so in one line on stderr and goes on alone.
"""

from __future__ import annotations

import os
import sys


class DaemonView:
    """root: what the command reads. client: set only when a daemon serves that root."""

    def __init__(self, root: str, socket: str, client=None, health: dict | None = None,  # noqa: ANN001
                 note: str = "") -> None:
        self.root = root
        self.socket = socket
        self.client = client
        self.health = health or {}
        self.note = note
        self._leases: list[dict] | None = None

    @property
    def serves_root(self) -> bool:
        return self.client is not None

    @property
    def irq_mode(self) -> str | None:
        irq = self.health.get("irq")
        return irq.get("mode") if isinstance(irq, dict) else None

    def leases(self) -> list[dict]:
        """The daemon's leases ([] without a daemon serving this root)."""
        if self.client is None:
            return []
        if self._leases is None:
            self._leases = self.client.leases()
        return self._leases

    def leased_cpus(self) -> set[int]:
        return {int(cpu) for lease in self.leases() for cpu in lease.get("cpus", [])}

    def leased_gpus(self) -> set[int]:
        return {int(gpu) for lease in self.leases() for gpu in lease.get("gpus", [])}

    def lease(self, lease_id: str) -> dict:
        from topod.cli.exits import DaemonUnavailableError, NotFoundError

        if self.client is None:
            raise DaemonUnavailableError(f"a lease needs the daemon: {self.note}")
        for lease in self.leases():
            if lease.get("id") == lease_id:
                return lease
        known = ", ".join(sorted(str(item.get("id")) for item in self.leases())) or "none"
        raise NotFoundError(f"no lease {lease_id!r} at topod {self.socket}; known: {known}")

    def lease_summary(self) -> str:
        """'2 lease(s), GPUs 0-3 leased, CPUs 1-8 leased' (for headers and stderr)."""
        from topod.cpulist import format_cpulist

        leases = self.leases()
        text = f"{len(leases)} lease(s)"
        if leases:
            text += f", GPUs {format_cpulist(sorted(self.leased_gpus())) or '-'} and " \
                    f"CPUs {format_cpulist(sorted(self.leased_cpus())) or '-'} leased"
        return text

    def describe(self) -> str:
        """One line: the root read and what the daemon contributes."""
        if self.client is None:
            return f"root {self.root}; {self.note}"
        health = self.health  # no extra request: the counts come with the health answer
        return f"root {self.root}; topod at {self.socket} serves it: {health.get('leases', '?')} lease(s), " \
               f"{health.get('gpus_free', '?')}/{health.get('gpus', '?')} GPU(s) free, " \
               f"IRQ mode {self.irq_mode or 'unknown'}"

    def announce(self, as_json: bool = False) -> None:
        """The one stderr line every host-side command prints; with --json a JSON line
        (stderr then holds only JSON lines: this one, and an error object if one follows)."""
        if as_json:
            import json

            line = json.dumps({"root": self.root, "socket": self.socket, "daemon": self.serves_root,
                               "irq_mode": self.irq_mode if self.serves_root else None,
                               "note": self.describe()})
        else:
            line = f"topoctl: {self.describe()}"
        sys.stderr.write(line + "\n")


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def find(args, default_root: str = "/", timeout: float = 5.0) -> DaemonView:  # noqa: ANN001 - Namespace
    """The root to read (args.root, else the daemon's, else default_root) and the daemon
    serving it. Never raises for a missing or silent daemon: the view's note says why."""
    given = getattr(args, "root", None)
    path = getattr(args, "socket", None) or os.environ.get("TOPOD_SOCKET") or "/run/topod/topod.sock"
    root = given if given is not None else default_root
    if not os.path.exists(path):  # the common case without a daemon costs one stat
        return DaemonView(root, path, note=f"no daemon at {path} (not running): host view only, no leases")
    from topod.client import ApiError, Client

    client = Client(path, timeout=timeout)
    try:
        health = client.health()
    except ApiError as exc:
        return DaemonView(root, path, note=f"no daemon answered at {path} ({exc}): host view only, no leases")
    served = str(health.get("root") or "")
    if given is None and served:
        return DaemonView(served, path, client, health)
    if served and _same_path(given, served):
        return DaemonView(given, path, client, health)
    return DaemonView(root, path, health=health,
                      note=f"topod at {path} serves {served or 'an unknown root'}, not {root}: its leases are not used")
