"""The IRQ cycle inside the daemon: the balancer, fed the live topology and leased CPUs."""

from __future__ import annotations

import structlog

from topod.irq.cycle import IrqBalancer
from topod.irq.settings import IrqSettings

log = structlog.get_logger("topod")


class IrqTask:
    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.balancer = IrqBalancer(daemon.host, IrqSettings.from_section(daemon.config.section("irq")))
        self.last_moves = 0
        self.moves_total = 0

    def configure(self, config) -> None:
        self.balancer.configure(IrqSettings.from_section(config.section("irq")))

    def cycle(self) -> None:
        report = self.balancer.cycle(self.daemon.topology, self.daemon.alloc.leased_cpus())
        self.last_moves = report.moves
        self.moves_total += report.moves
        for event in report.events:
            fields = {k: v for k, v in event.items() if k != "event"}
            self.daemon.bus.publish(str(event.get("event", "irq_event")), **fields)
        if report.rediscover:
            self.daemon._rescan.set()

    def report(self) -> dict:
        return self.balancer.report()

    def status(self) -> str:
        return f"IRQ cycle {self.balancer.cycles} ({self.balancer.settings.mode}), {self.last_moves} move(s)"
