"""What the last full cycle saw, kept so a lease change can be re-planned without /proc.

A full cycle reads every /proc/irq/N and /proc/interrupts; a lease granted or released
changes only which CPUs are eligible. The Baseline keeps the classified IRQs, their
affinity (updated with what each later write left), the measured load and, per device,
its spreading pool and the CPUs that pool depends on, indexed by CPU. From the CPUs whose
lease state changed it finds, in time proportional to them and the IRQs they touch, the
devices whose pool changed and the spread groups those pools belong to (no I/O).
"""

from __future__ import annotations

from collections.abc import Mapping

from topod.irq.classify import IrqInfo
from topod.irq.planner import DevicePool, device_pools
from topod.irq.procfs import IrqAffinity, Load
from topod.irq.settings import IrqSettings
from topod.model import Topology
from topod.record import field, record


@record(frozen=False)
class Baseline:
    topology: Topology
    settings: IrqSettings
    mode: str
    may_write: bool  # the last full cycle's verdict (mode, irqbalance)
    held: bool  # not writing because irqbalance runs and topod yields
    leased: frozenset[int]
    irqs: dict[int, IrqInfo]
    affinity: dict[int, IrqAffinity]
    load: Load | None
    background: Mapping[int, float]
    pools: dict[str, DevicePool] = field(default_factory=dict)
    device_irqs: dict[str, list[int]] = field(default_factory=dict)
    by_cpu: dict[int, set[str]] = field(default_factory=dict)  # cpu -> devices whose pool depends on it
    anywhere: set[str] = field(default_factory=set)  # devices whose pool depends on every CPU
    by_order: dict[tuple[int, ...], set[str]] = field(default_factory=dict)  # spread group -> devices

    @classmethod
    def build(cls, topology: Topology, settings: IrqSettings, mode: str, may_write: bool, held: bool,
              leased: frozenset[int], irqs: dict[int, IrqInfo], affinity: dict[int, IrqAffinity],
              load: Load | None, background: Mapping[int, float], previous: Baseline | None = None) -> Baseline:
        """affinity becomes the baseline's own (updated by later writes). The pools and
        their indexes depend only on the topology, settings, leased CPUs and each device's
        IRQs: when `previous` (the baseline this one replaces, dropped after) had the same,
        they are taken over rather than computed again (a quiet host's cycle then costs little)."""
        base = cls(topology, settings, mode, may_write, held, leased, irqs, affinity, load, background)
        for irq, info in irqs.items():
            if info.device is not None:
                base.device_irqs.setdefault(info.device, []).append(irq)
        if previous is not None and previous.topology is topology and previous.settings is settings \
                and previous.leased == leased and previous.device_irqs == base.device_irqs:
            base.pools, base.by_cpu, base.anywhere, base.by_order = \
                previous.pools, previous.by_cpu, previous.anywhere, previous.by_order
            return base
        base.pools = device_pools(topology, base.device_irqs, leased, settings)
        for address, pool in base.pools.items():
            base._index(address, pool)
        return base

    def _index(self, address: str, pool: DevicePool) -> None:
        if pool.watch is None:
            self.anywhere.add(address)
        else:
            for cpu in pool.watch:
                self.by_cpu.setdefault(cpu, set()).add(address)
        if pool.order is not None:
            self.by_order.setdefault(pool.order, set()).add(address)

    def _unindex(self, address: str, pool: DevicePool) -> None:
        if pool.watch is None:
            self.anywhere.discard(address)
        else:
            for cpu in pool.watch:
                self.by_cpu.get(cpu, set()).discard(address)
        if pool.order is not None:
            self.by_order.get(pool.order, set()).discard(address)

    def lease_change(self, leased: frozenset[int]) -> tuple[list[int], int]:
        """Move the baseline to the new leased set; return (the IRQs to re-plan, in IRQ order;
        how many devices' pools changed). Those IRQs are every IRQ of the spread groups a
        changed pool left or joined: exactly what a full cycle would balance differently."""
        changed_cpus = self.leased ^ leased
        self.leased = leased
        if not changed_cpus:
            return [], 0
        candidates = set(self.anywhere)
        for cpu in changed_cpus:
            candidates |= self.by_cpu.get(cpu, set())
        fresh = device_pools(self.topology, sorted(candidates), leased, self.settings)
        touched: set[tuple[int, ...]] = set()
        affected: set[str] = set()
        changed = 0
        for address, pool in fresh.items():
            old = self.pools[address]
            if pool.order == old.order:
                continue
            changed += 1
            affected.add(address)
            touched.update(order for order in (old.order, pool.order) if order is not None)
            self._unindex(address, old)
            self.pools[address] = pool
            self._index(address, pool)
        for order in touched:
            affected |= self.by_order.get(order, set())
        replan = sorted(irq for address in affected for irq in self.device_irqs.get(address, ()))
        return replan, changed
