"""Node load for back-pressure: the busy share of each NUMA node's CPUs between two reads
of /proc/stat (the same counters top and mpstat use). Parsing and arithmetic are pure;
NodeLoadSampler holds the previous sample."""

from __future__ import annotations

from dataclasses import dataclass

from topod.host import HostRoot
from topod.model import Topology

# /proc/stat "cpuN" columns: user nice system idle iowait irq softirq steal guest guest_nice.
# guest time is already counted in user, so only the first eight add up to the total.
IDLE_COLUMNS = (3, 4)  # idle, iowait
COUNTED = 8


@dataclass(frozen=True, slots=True)
class CpuTicks:
    busy: int
    total: int


def parse_cpu_ticks(text: str) -> dict[int, CpuTicks]:
    """/proc/stat -> {cpu: ticks}; malformed lines are skipped (an old or odd kernel
    must not stop back-pressure for the others)."""
    out: dict[int, CpuTicks] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        label, *columns = line.split()
        try:
            cpu = int(label[3:])
            values = [int(v) for v in columns[:COUNTED]]
        except ValueError:
            continue
        if len(values) < 5 or any(v < 0 for v in values):
            continue
        total = sum(values)
        idle = sum(values[i] for i in IDLE_COLUMNS if i < len(values))
        out[cpu] = CpuTicks(busy=total - idle, total=total)
    return out


def node_load(before: dict[int, CpuTicks], after: dict[int, CpuTicks], topology: Topology) -> dict[int, float]:
    """{node: busy share in [0, 1]} over the interval; nodes without a measured CPU are
    left out (the engine counts them as unloaded, never as full)."""
    load: dict[int, float] = {}
    for node in topology.numa_nodes:
        busy = total = 0
        for cpu in node.cpus:
            a, b = before.get(cpu), after.get(cpu)
            if a is None or b is None or b.total < a.total or b.busy < a.busy:
                continue  # counters reset (CPU hot-plugged): skip this CPU this round
            busy += b.busy - a.busy
            total += b.total - a.total
        if total > 0:
            load[node.id] = min(1.0, max(0.0, busy / total))
    return load


class NodeLoadSampler:
    def __init__(self, host: HostRoot) -> None:
        self.host = host
        self._previous: dict[int, CpuTicks] | None = None

    def sample(self, topology: Topology) -> dict[int, float]:
        """Load since the previous call ({} on the first)."""
        current = parse_cpu_ticks(self.host.read("proc/stat") or "")
        previous, self._previous = self._previous, current
        if previous is None:
            return {}
        return node_load(previous, current, topology)
