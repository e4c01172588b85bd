"""A collector for the guesses and skips discovery makes (they end in Topology.warnings)."""

from __future__ import annotations

from topod.model import HostWarning


class Notes:
    def __init__(self) -> None:
        self.items: list[HostWarning] = []

    def add(self, code: str, path: str, reason: str) -> None:
        self.items.append(HostWarning(code=code, path=path, reason=reason))
