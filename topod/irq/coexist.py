"""irqbalance coexistence: find a running irqbalance through the host root, and say how
to make it leave topod's IRQs and the jobs' CPUs alone. Two balancers moving the same
IRQs fight silently; topod never does that: it yields or it tells the operator what to ban.
"""

from __future__ import annotations

from topod.cpulist import format_cpulist
from topod.host import HostRoot
from topod.record import record


@record
class IrqbalanceState:
    running: bool
    evidence: tuple[str, ...]  # the files that said so

    def to_json(self) -> dict[str, object]:
        return {"running": self.running, "evidence": list(self.evidence)}


def detect_irqbalance(host: HostRoot) -> IrqbalanceState:
    """A process named irqbalance, or the socket/pid files it leaves in /run. A run file
    without a visible process still counts: the process may be in another PID namespace,
    and a false alarm costs a line in the report where a miss costs a silent fight."""
    evidence = [f"/proc/{pid}/comm" for pid in host.listdir("proc")
                if pid.isdigit() and (host.read_line(f"proc/{pid}/comm") or "") == "irqbalance"]
    evidence += [f"/run/{name}" for name in host.listdir("run") if name.startswith("irqbalance")]
    return IrqbalanceState(bool(evidence), tuple(evidence))


def cpumask(cpus: list[int] | set[int] | tuple[int, ...]) -> str:
    """[0, 33] -> '00000002,00000001' (comma-separated 32-bit words, as irqbalance reads)."""
    value = sum(1 << cpu for cpu in set(cpus))
    words = max(1, (max(cpus, default=0) // 32) + 1)
    return ",".join(f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


def ban_guidance(irqs: list[int] | tuple[int, ...], keep_clear: list[int] | set[int] | tuple[int, ...]) -> str:
    """The settings that keep irqbalance off topod's IRQs (--banirq) and off the CPUs that
    must stay free of IRQs (leased, isolated, banned)."""
    lines = ["irqbalance is running alongside topod. So that the two do not move the same IRQs,",
             "set in /etc/default/irqbalance (Debian/Ubuntu) or /etc/sysconfig/irqbalance (RHEL), then restart it:"]
    if irqs:
        lines.append('  IRQBALANCE_ARGS="' + " ".join(f"--banirq={irq}" for irq in sorted(irqs)) + '"')
    if keep_clear:
        lines.append(f'  IRQBALANCE_BANNED_CPULIST="{format_cpulist(sorted(keep_clear))}"   (irqbalance >= 1.8)')
        lines.append(f'  IRQBALANCE_BANNED_CPUS="{cpumask(keep_clear)}"   (older irqbalance)')
    lines.append("or stop it: systemctl disable --now irqbalance")
    return "\n".join(lines)
