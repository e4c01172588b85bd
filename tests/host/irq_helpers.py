"""Test seams for the IRQ balancer on host-tree copies: a kernel-like write hook, counter
advancing between cycles, and a settable clock. Tests run as root, so file modes cannot
simulate a managed IRQ; HostRoot.write_fault does."""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from topod.cpulist import parse_cpulist
from topod.discover import discover
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.irq.procfs import parse_interrupts
from topod.model import Topology

_BUILT: dict[str, tuple[Path, Topology]] = {}


def built_host(factory, name: str, edit=None, key: str = "") -> tuple[Path, Topology]:
    """A built-in host tree built once per session (optionally with its spec edited), and
    its discovered Topology. Read-only: tests write to an irq_root() copy."""
    cache_key = f"{name}/{key}"
    if cache_key not in _BUILT:
        spec = load_builtin_spec(name)
        if edit is not None:
            edit(spec)
        root = build_host(spec, factory.mktemp(f"irq-{name}"))
        _BUILT[cache_key] = (root, discover(HostRoot(root)))
    return _BUILT[cache_key]


def irq_root(built: Path, dest: Path) -> Path:
    """A fresh writable copy of what the IRQ cycle reads and writes (proc/ and the builder's
    facts). The whole tree is thousands of files; the cycle never reads sys/, discovery does,
    and the Topology comes from built_host()."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built / "proc", dest / "proc")
    shutil.copy(built / "topod-fixture.json", dest / "topod-fixture.json")
    return dest


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Kernel:
    """A write_fault that answers like the kernel: managed IRQs -> EIO, scripted errnos per
    IRQ (one per write, in turn), and on success the effective affinity follows the write
    (the first CPU written, as x86 vector allocation picks one). refuse_all: an errno every
    write gets (EROFS: /proc/irq mounted read-only); set it to None to make /proc/irq
    writable again."""

    def __init__(self, host: HostRoot, managed: tuple[int, ...] | list[int] = (),
                 faults: Mapping[int, list[int]] | None = None,
                 no_space: Mapping[int, set[int]] | None = None, refuse_all: int | None = None) -> None:
        self.host = host
        self.refuse_all = refuse_all
        self.managed = set(managed)
        self.faults = {irq: list(codes) for irq, codes in (faults or {}).items()}
        self.no_space = {cpu for cpus in (no_space or {}).values() for cpu in cpus}
        self.writes: list[tuple[int, str]] = []
        host.write_fault = self

    def __call__(self, rel: str, text: str) -> None:
        parts = rel.strip("/").split("/")
        irq = int(parts[2])
        self.writes.append((irq, text.strip()))
        if self.refuse_all is not None:
            raise OSError(self.refuse_all, "refused")
        if irq in self.managed:
            raise OSError(errno.EIO, "managed")
        if self.faults.get(irq):
            raise OSError(self.faults[irq].pop(0), "scripted")
        cpus = parse_cpulist(text)
        if len(cpus) == 1 and cpus[0] in self.no_space:
            raise OSError(errno.ENOSPC, "no vector space")
        self.host.path(f"proc/irq/{irq}/effective_affinity_list").write_text(f"{cpus[0]}\n")


class ReadLog:
    """Records every path the balancer reads through a HostRoot (to prove what it did not read)."""

    def __init__(self, host: HostRoot) -> None:
        self.paths: list[str] = []
        self._read = host.read
        host.read = self  # type: ignore[method-assign]

    def __call__(self, rel: str) -> str | None:
        self.paths.append(rel.strip("/"))
        return self._read(rel)

    def irqs(self) -> set[int]:
        """The IRQs whose /proc/irq/N files were read."""
        return {int(p.split("/")[2]) for p in self.paths if p.startswith("proc/irq/")}


def managed_irqs(root: Path) -> list[int]:
    return json.loads((root / "topod-fixture.json").read_text())["managed_irqs"]


def device_irqs(root: Path, kind: str) -> dict[str, list[int]]:
    devices = json.loads((root / "topod-fixture.json").read_text())["devices"]
    return {addr: d["irqs"] for addr, d in devices.items() if d["kind"] == kind}


def advance_interrupts(root: Path, counts: Mapping[int, int], irq_ticks: Mapping[int, int] | None = None) -> None:
    """Add counts[irq] interrupts on the CPU the IRQ is delivered to (its effective
    affinity), as the kernel's counters would grow; irq_ticks adds irq+softirq time per CPU."""
    path = root / "proc/interrupts"
    table = parse_interrupts(path.read_text())
    column = {cpu: i for i, cpu in enumerate(table.cpus)}
    out = []
    for line in path.read_text().splitlines(keepends=True):
        label, sep, rest = line.partition(":")
        if sep and label.strip().isdigit() and int(label) in counts:
            irq = int(label)
            effective = (root / f"proc/irq/{irq}/effective_affinity_list").read_text()
            values = list(table.lines[irq].counts)
            values[column[parse_cpulist(effective)[0]]] += counts[irq]
            tail = rest.split(None, len(values))[-1] if len(rest.split()) > len(values) else "\n"
            line = f"{label}:" + "".join(f"{v:>11}" for v in values) + "  " + tail
        out.append(line)
    path.write_text("".join(out))
    if irq_ticks:
        stat = root / "proc/stat"
        lines = []
        for line in stat.read_text().splitlines():
            fields = line.split()
            if fields and fields[0][3:].isdigit() and int(fields[0][3:]) in irq_ticks:
                fields[6] = str(int(fields[6]) + irq_ticks[int(fields[0][3:])])
                line = " ".join(fields)
            lines.append(line)
        stat.write_text("\n".join(lines) + "\n")


def delivered(root: Path, irq: int) -> list[int]:
    return parse_cpulist((root / f"proc/irq/{irq}/effective_affinity_list").read_text())


def requested(root: Path, irq: int) -> list[int]:
    return parse_cpulist((root / f"proc/irq/{irq}/smp_affinity_list").read_text())
