"""Readers for the /proc files the IRQ balancer needs: parsers take text, readers take a HostRoot.

Each parser tolerates what real kernels print: the ERR/MIS lines, per-CPU-only lines
(NMI, LOC, ...), lines without a name field, and old formats without a hwirq column.
`measure_load` turns two snapshots into rates; a counter that went backwards or a
changed CPU column count means "rescan", never a negative rate or a crash.
"""

from __future__ import annotations

import operator
import re
from functools import lru_cache
from itertools import compress

from topod.cpulist import parse_cpulist
from topod.host import HostRoot
from topod.record import field, record

# A hwirq column: '0-edge', '1048576-edge', '2-fasteoi', or a bare number on some chips.
_HWIRQ = re.compile(r"^\d+(-[a-z]+)?$")
# /proc/stat columns after the label: user nice system idle iowait irq softirq steal ...
_STAT_IRQ, _STAT_SOFTIRQ = 5, 6
# The softirqs a device's interrupts raise on the CPU that took them.
DEVICE_SOFTIRQS = ("NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET")


@record
class InterruptLine:
    irq: int
    counts: tuple[int, ...]  # one per column of Interrupts.cpus
    chip: str | None
    hwirq: str | None
    name: str | None


@record
class Interrupts:
    cpus: tuple[int, ...]  # the CPU of each count column (online CPUs, header order)
    lines: dict[int, InterruptLine]
    # each IRQ line's text -> what it parsed to, for the next parse to reuse (see parse_interrupts)
    texts: dict[str, InterruptLine] = field(default_factory=dict, compare=False, repr=False)


@record
class IrqAffinity:
    requested: tuple[int, ...] | None  # smp_affinity_list: what was asked for
    effective: tuple[int, ...] | None  # effective_affinity_list: where the kernel delivers
    node: int | None

    @property
    def delivered(self) -> tuple[int, ...] | None:
        """Where interrupts go: effective when the kernel says, else requested."""
        return self.effective or self.requested


@record
class Snapshot:
    """One read of every counter the balancer uses, stamped with a monotonic time."""

    time: float
    interrupts: Interrupts
    softirqs: dict[str, dict[int, int]]  # softirq name -> cpu -> count
    cpu_irq_ticks: dict[int, int]  # cpu -> irq + softirq time from /proc/stat (USER_HZ ticks)
    affinity: dict[int, IrqAffinity]  # kept current by the cycle's own writes
    warnings: tuple[str, ...] = ()
    affinity_read: float | None = None  # when every IRQ's affinity was last read (read_snapshot)


@record
class Load:
    """Rates between two snapshots. weight is the planner's unit: interrupts/s scaled by
    the per-interrupt cost the CPU's irq+softirq time shows (or plain rates without it)."""

    seconds: float
    irq_rate: dict[int, float]  # irq -> interrupts/s, all CPUs
    irq_cpu_rate: dict[int, dict[int, float]]  # irq -> cpu -> interrupts/s
    cpu_busy: dict[int, float]  # cpu -> share of time in irq+softirq (0..1)
    cpu_softirq_rate: dict[int, float] = field(default_factory=dict)  # cpu -> device softirqs/s
    weight: dict[int, float] = field(default_factory=dict)  # irq -> load weight
    unit: str = "interrupts/s"


def parse_interrupts(text: str, previous: Interrupts | None = None) -> Interrupts:
    """/proc/interrupts text -> Interrupts. Raises ValueError when the header names no CPU.

    With `previous` (the last parse, same CPU columns), a line whose text is unchanged is
    not split and converted again: its parsed line is reused. On a quiet host most device
    IRQs take no interrupt between two cycles, and the column conversion (192 CPUs x 108
    IRQs on the h800 host) was a third of the IRQ worker's idle cycle."""
    lines = text.splitlines()
    header = lines[0].split() if lines else []
    cpus = tuple(int(tok[3:]) for tok in header if tok.startswith("CPU") and tok[3:].isdigit())
    if not cpus:
        raise ValueError("/proc/interrupts: header names no CPU column")
    table: dict[int, InterruptLine] = {}
    texts: dict[str, InterruptLine] = {}
    known = previous.texts if previous is not None and previous.cpus == cpus else {}
    width = len(cpus)
    for line in lines[1:]:
        parsed = known.get(line)
        if parsed is not None:
            table[parsed.irq] = texts[line] = parsed
            continue
        label, sep, rest = line.partition(":")
        label = label.strip()
        if not sep or not label.isdigit():
            continue  # NMI, LOC, ERR, MIS ...: per-CPU or global counters, not IRQs
        tokens = rest.split()
        head = tokens[:width]
        try:  # the common line: a count in every column (int() over them all at C speed)
            if len(head) < width or not head[-1].isdigit():
                raise ValueError
            counts = tuple(map(int, head))
            tail = tokens[width:]
        except ValueError:  # a short line: the counts stop early, missing columns count as 0
            found: list[int] = []
            for token in head:
                if not token.isdigit():
                    break
                found.append(int(token))
            tail = tokens[len(found):]
            counts = tuple(found) + (0,) * (width - len(found))
        chip, hwirq, name = _split_tail(tail)
        table[int(label)] = texts[line] = InterruptLine(int(label), counts, chip, hwirq, name)
    return Interrupts(cpus, table, texts)


def _split_tail(tail: list[str]) -> tuple[str | None, str | None, str | None]:
    """['IR-PCI-MSIX-0000:14:00.0', '0-edge', 'mlx5_comp0@pci:0000:14:00.0'] -> (chip, hwirq, name).
    Chip names may hold spaces on some architectures; the hwirq column marks their end."""
    if not tail:
        return None, None, None
    for index in range(1, len(tail)):
        if _HWIRQ.match(tail[index]):
            name = " ".join(tail[index + 1:]) or None
            return " ".join(tail[:index]), tail[index], name
    # Old kernels: 'PCI-MSI-edge eth0' (the trigger is part of the chip, no hwirq).
    return tail[0], None, " ".join(tail[1:]) or None


def parse_softirqs(text: str) -> dict[str, dict[int, int]]:
    """/proc/softirqs -> {name: {cpu: count}}; lines that do not parse are skipped."""
    lines = text.splitlines()
    if not lines:
        return {}
    cpus = [int(tok[3:]) for tok in lines[0].split() if tok.startswith("CPU") and tok[3:].isdigit()]
    table: dict[str, dict[int, int]] = {}
    for line in lines[1:]:
        label, sep, rest = line.partition(":")
        values = rest.split()
        if not sep or not all(v.isdigit() for v in values):
            continue
        table[label.strip()] = {cpu: int(v) for cpu, v in zip(cpus, values)}
    return table


def parse_stat_irq_ticks(text: str) -> dict[int, int]:
    """/proc/stat -> {cpu: irq + softirq ticks}; CPUs whose line is short are skipped."""
    ticks: dict[int, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or not fields[0].startswith("cpu") or not fields[0][3:].isdigit():
            continue
        values = fields[1:]
        if len(values) <= _STAT_SOFTIRQ or not all(v.isdigit() for v in values[: _STAT_SOFTIRQ + 1]):
            continue
        ticks[int(fields[0][3:])] = int(values[_STAT_IRQ]) + int(values[_STAT_SOFTIRQ])
    return ticks


def parse_affinity(requested: str | None, effective: str | None, node: str | None) -> IrqAffinity:
    return IrqAffinity(_cpus_or_none(requested), _cpus_or_none(effective), _int_or_none(node))


@lru_cache(maxsize=1024)  # a cycle reads two CPU lists per IRQ, and most say the same few things
def _cpus_or_none(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        cpus = parse_cpulist(text)
    except ValueError:
        return None
    return tuple(cpus) or None


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


# ---------------------------------------------------------------- readers (HostRoot)


def read_affinity(host: HostRoot, irq: int) -> IrqAffinity:
    """The two files the balancer uses (not `node`: the device's node comes from the
    topology), so a full cycle costs two opens per IRQ, not three."""
    base = f"proc/irq/{irq}"
    return parse_affinity(host.read(f"{base}/smp_affinity_list"), host.read(f"{base}/effective_affinity_list"), None)


def read_snapshot(host: HostRoot, now: float, previous: Snapshot | None = None) -> Snapshot:
    """Everything one cycle reads. A missing or unparsable /proc/interrupts gives an empty
    table and a warning: the cycle then plans nothing rather than failing. `previous`
    (the last snapshot) lends its unchanged /proc/interrupts lines (parse_interrupts)."""
    warnings: list[str] = []
    text = host.read("proc/interrupts")
    try:
        interrupts = parse_interrupts(text or "", previous.interrupts if previous is not None else None)
    except ValueError as exc:
        warnings.append(f"/proc/interrupts unreadable ({exc if text is not None else 'missing'}); no IRQ planned")
        interrupts = Interrupts((), {})
    softirqs = parse_softirqs(host.read("proc/softirqs") or "")
    ticks = parse_stat_irq_ticks(host.read("proc/stat") or "")
    affinity, read_at = read_affinities(host, interrupts, previous, now)
    return Snapshot(now, interrupts, softirqs, ticks, affinity, tuple(warnings), read_at)


# An IRQ's affinity files are read again when its /proc/interrupts line changed since the
# last cycle (it took an interrupt, or it is new), and every IRQ's at least this often.
# An IRQ that took no interrupt loads no CPU wherever it points, and the cycle's own
# writes keep the view of what topod moved current; so on a quiet host a cycle reads
# three files, not two per IRQ (216 on the h800 host: most of the IRQ worker's idle
# CPU). A change made by someone else to an IRQ that stays silent is seen within
# this refresh.
AFFINITY_REFRESH_SECONDS = 60.0


def read_affinities(host: HostRoot, interrupts: Interrupts, previous: Snapshot | None,
                    now: float) -> tuple[dict[int, IrqAffinity], float]:
    """(affinity per IRQ, when every IRQ's was last read)."""
    last = previous.affinity_read if previous is not None else None
    if last is None or not 0 <= now - last < AFFINITY_REFRESH_SECONDS:
        return {irq: read_affinity(host, irq) for irq in interrupts.lines}, now
    before, known = previous.interrupts.lines, previous.affinity
    affinity = {}
    for irq, line in interrupts.lines.items():
        kept = known.get(irq)
        # parse_interrupts lends an unchanged line's parsed object: the same object is the
        # same text (counts, chip, name)
        quiet = kept is not None and kept.requested is not None and before.get(irq) is line
        affinity[irq] = kept if quiet else read_affinity(host, irq)
    return affinity, last


# ---------------------------------------------------------------- rates (pure)


def measure_load(before: Snapshot | None, after: Snapshot, user_hz: int = 100) -> tuple[Load | None, str | None]:
    """(Load, None), or (None, why there is no rate this cycle)."""
    if before is None:
        return None, "first cycle: no previous counters"
    seconds = after.time - before.time
    if seconds <= 0:
        return None, "no time passed since the previous cycle"
    if before.interrupts.cpus != after.interrupts.cpus:
        return None, "CPU columns changed in /proc/interrupts (CPU hotplug): rescan, no rate this cycle"
    irq_cpu_rate: dict[int, dict[int, float]] = {}
    cpus = after.interrupts.cpus
    columns = range(len(cpus))
    for irq, line in after.interrupts.lines.items():
        old = before.interrupts.lines.get(irq)
        if old is None:
            continue  # new IRQ: rate from the next cycle on
        if line.counts == old.counts:
            irq_cpu_rate[irq] = {}
            continue
        # Column arithmetic at C speed: 4,096 IRQs x 512 CPUs is two million columns.
        deltas = list(map(operator.sub, line.counts, old.counts))
        if min(deltas) < 0:
            return None, f"IRQ {irq} counters went backwards (IRQ freed and reused): rescan, no rate this cycle"
        irq_cpu_rate[irq] = {cpus[i]: deltas[i] / seconds for i in compress(columns, deltas)}
    busy = {cpu: max(0.0, (ticks - before.cpu_irq_ticks.get(cpu, ticks)) / user_hz / seconds)
            for cpu, ticks in after.cpu_irq_ticks.items()}
    rates = {irq: sum(per_cpu.values()) for irq, per_cpu in irq_cpu_rate.items()}
    weight, unit = _weights(irq_cpu_rate, busy)
    return Load(seconds, rates, irq_cpu_rate, busy, _softirq_rates(before, after, seconds), weight, unit), None


def _softirq_rates(before: Snapshot, after: Snapshot, seconds: float) -> dict[int, float]:
    rates: dict[int, float] = {}
    for name in DEVICE_SOFTIRQS:
        old = before.softirqs.get(name, {})
        for cpu, count in after.softirqs.get(name, {}).items():
            delta = count - old.get(cpu, count)
            if delta > 0:
                rates[cpu] = rates.get(cpu, 0.0) + delta / seconds
    return rates


def _weights(irq_cpu_rate: dict[int, dict[int, float]], busy: dict[int, float]) -> tuple[dict[int, float], str]:
    """Each IRQ's share of its CPUs' irq+softirq time, so a NIC queue whose interrupts each
    raise a long NET_RX weighs more than a cheap one. Without measured time: plain rates."""
    cpu_rate: dict[int, float] = {}
    for per_cpu in irq_cpu_rate.values():
        for cpu, rate in per_cpu.items():
            cpu_rate[cpu] = cpu_rate.get(cpu, 0.0) + rate
    if not any(busy.get(cpu, 0.0) > 0 for cpu in cpu_rate):
        return {irq: sum(per_cpu.values()) for irq, per_cpu in irq_cpu_rate.items()}, "interrupts/s"
    # CPUs that took interrupts but show no irq time (coarse ticks) get the mean cost.
    costs = {cpu: busy.get(cpu, 0.0) / rate for cpu, rate in cpu_rate.items() if rate > 0}
    measured = [c for c in costs.values() if c > 0]
    mean = sum(measured) / len(measured) if measured else 0.0
    weight = {irq: sum(rate * (costs.get(cpu) or mean) for cpu, rate in per_cpu.items())
              for irq, per_cpu in irq_cpu_rate.items()}
    return weight, "cpu-share"
