"""`topoctl irq plan` and `topoctl irq apply --oneshot`: the IRQ balancer without the daemon."""

from __future__ import annotations

import argparse
import json
import sys
import time


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", help="host root (a captured tree); default /")
    parser.add_argument("--json", action="store_true", help="machine-readable output (the /v1/irqs document)")
    parser.add_argument("--config", default=None, help="topod.toml whose [irq] section to use (default: defaults)")
    parser.add_argument("--leased-cpus", default="", help="CPU list to treat as leased, e.g. 4-7")
    parser.add_argument("--banned-cpus", default=None, help="override irq.banned_cpus")
    parser.add_argument("--housekeeping-cpus", default=None, help="override irq.housekeeping_cpus")
    parser.add_argument("--irqbalance", choices=("yield", "ban"), default=None, help="override irq.irqbalance")


def register(subparsers: argparse._SubParsersAction) -> None:
    irq = subparsers.add_parser("irq", help="plan or apply IRQ affinity")
    sub = irq.add_subparsers(dest="irq_command", metavar="SUBCOMMAND")
    plan = sub.add_parser("plan", help="show where each device IRQ would go, and why (writes nothing)")
    _common(plan)
    plan.add_argument("--interval", type=float, default=0.0,
                      help="sample counters this many seconds to plan with measured load (default: counts only)")
    plan.set_defaults(handler=run_plan)
    apply = sub.add_parser("apply", help="run one balancing cycle")
    _common(apply)
    apply.add_argument("--oneshot", action="store_true", help="one cycle, then exit (continuous balancing is topod's)")
    apply.add_argument("--dry-run", action="store_true", help="plan and report, write nothing")
    apply.set_defaults(handler=run_apply)
    irq.set_defaults(handler=lambda args: (irq.print_help(sys.stderr), 2)[1])


def _settings(args: argparse.Namespace):
    from topod.irq import IrqSettings

    section: dict = {}
    if args.config:
        from topod.config import load_config

        section = load_config(args.config).section("irq")
    for key, value in (("banned_cpus", args.banned_cpus), ("housekeeping_cpus", args.housekeeping_cpus),
                       ("irqbalance", args.irqbalance)):
        if value is not None:
            section[key] = value
    return IrqSettings.from_section(section)


def _setup(args: argparse.Namespace):
    from topod.cpulist import parse_cpulist
    from topod.discover import discover
    from topod.errors import ConfigError
    from topod.host import HostRoot
    from topod.irq import IrqBalancer

    try:
        leased = parse_cpulist(args.leased_cpus)
    except ValueError as exc:
        raise ConfigError(f"--leased-cpus: {exc}") from exc
    host = HostRoot(args.root)
    return IrqBalancer(host, _settings(args)), discover(host), leased


def run_plan(args: argparse.Namespace) -> int:
    from topod.errors import ConfigError

    if args.interval < 0:
        raise ConfigError(f"--interval must be >= 0 seconds, got {args.interval}")
    balancer, topology, leased = _setup(args)
    if args.interval > 0:
        balancer.cycle(topology, leased, mode="dry-run")
        time.sleep(args.interval)
    report = balancer.cycle(topology, leased, mode="dry-run")
    _print(report, args.json)
    return 0


def run_apply(args: argparse.Namespace) -> int:
    from topod.errors import ConfigError

    if not args.oneshot:
        raise ConfigError("topoctl irq apply needs --oneshot (continuous balancing runs inside topod)")
    balancer, topology, leased = _setup(args)
    report = balancer.cycle(topology, leased, mode="dry-run" if args.dry_run else "continuous")
    _print(report, args.json)
    return 0


def _print(report, as_json: bool) -> None:
    if as_json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    sys.stdout.write(render_report(report))


def render_report(report) -> str:
    from topod.cpulist import format_cpulist

    def cpus(value):
        return "-" if value is None else format_cpulist(value)

    rows = [("IRQ", "NAME", "DEVICE", "CLASS", "CURRENT", "PLANNED", "MANAGED", "STATUS", "REASON")]
    for e in report.plan.entries:
        if e.device is None and e.planned is None:
            continue  # timers and the like: in --json, not in the table
        rows.append((str(e.irq), e.name or "-", e.device or "-", e.irq_class, cpus(e.current), cpus(e.planned),
                     "yes" if e.managed else "no", report.status.get(e.irq, "unchanged"), e.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    summary = f"mode {report.mode}: {report.moves} moved"
    if report.plan.imbalance_before is not None:
        summary += f", load imbalance (max/mean) {report.plan.imbalance_before:.2f} -> {report.plan.imbalance_after:.2f}"
    out = [summary] + [f"note: {n}" for n in report.notes] + lines
    if report.guidance:
        out += ["", report.guidance]
    return "\n".join(out) + "\n"
