"""A collector for the guesses and skips discovery makes (they end in Topology.warnings)."""

from __future__ import annotations

from collections.abc import Iterable

from topod.cpulist import MAX_CPUS
from topod.host import ReadProblem
from topod.model import HostWarning


class Notes:
    def __init__(self) -> None:
        self.items: list[HostWarning] = []
        # CPU lists and masks naming a CPU at or beyond this are ignored (the host's
        # possible CPUs once read_cpu_facts has seen them).
        self.cpu_limit = MAX_CPUS

    def add(self, code: str, path: str, reason: str) -> None:
        self.items.append(HostWarning(code=code, path=path, reason=reason))

    def add_read_problems(self, problems: Iterable[ReadProblem]) -> None:
        """Files that were there but could not be read (permission_denied,
        not_a_regular_file, file_too_large, read_error), each path once."""
        seen: set[tuple[str, str]] = set()
        for problem in problems:
            key = (problem.code, problem.path)
            if key not in seen:
                seen.add(key)
                self.add(problem.code, problem.path, f"{problem.reason}; treated as missing")
