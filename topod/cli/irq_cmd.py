"""`topoctl irq plan` and `topoctl irq apply --oneshot`: the IRQ balancer run by hand.

With a daemon serving the same root, its leased CPUs are kept clear like --leased-cpus,
and `apply` refuses to write while that daemon balances the root continuously (it would
undo the daemon's placement, or the daemon would undo ours) unless --force.
Arguments: topod.cli.commands."""

from __future__ import annotations

import argparse
import json
import sys
import time


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


def _leased(args: argparse.Namespace) -> list[int]:
    from topod.cpulist import parse_cpulist
    from topod.errors import ConfigError

    try:
        return parse_cpulist(args.leased_cpus)
    except ValueError as exc:
        raise ConfigError(f"--leased-cpus: {exc}") from exc


def _setup(args: argparse.Namespace, view, leased: list[int]):  # noqa: ANN001 - DaemonView
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.irq import IrqBalancer

    host = HostRoot(view.root)
    settings = _settings(args)
    return IrqBalancer(host, settings), discover(host), sorted(set(leased) | view.leased_cpus())


def run_plan(args: argparse.Namespace) -> int:
    from topod.cli.daemon_view import find

    own = _leased(args)
    view = find(args)
    view.announce(args.json)
    balancer, topology, leased = _setup(args, view, own)
    if args.interval > 0:
        balancer.cycle(topology, leased, mode="dry-run")
        time.sleep(args.interval)
    report = balancer.cycle(topology, leased, mode="dry-run")
    _print(report, args.json, view)
    return 0


def run_apply(args: argparse.Namespace) -> int:
    from topod.errors import ConfigError

    if not args.oneshot:
        raise ConfigError("topoctl irq apply needs --oneshot (continuous balancing runs inside topod)")
    from topod.cli.daemon_view import find

    own = _leased(args)
    view = find(args)
    view.announce(args.json)
    if view.serves_root and view.irq_mode == "continuous" and not args.dry_run and not args.force:
        raise ConfigError(f"topod at {view.socket} balances the IRQs of {view.root} continuously "
                          "(irq.mode continuous): a one-shot apply would fight it. See its plan with "
                          "`topoctl irq plan`, set [irq] mode = \"dry-run\" or \"off\", or pass --force")
    balancer, topology, leased = _setup(args, view, own)
    report = balancer.cycle(topology, leased, mode="dry-run" if args.dry_run else "continuous")
    _print(report, args.json, view)
    return 0


def _print(report, as_json: bool, view) -> None:  # noqa: ANN001 - CycleReport, DaemonView
    if as_json:
        document = report.to_json()
        document.setdefault("root", view.root)
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    sys.stdout.write(f"root {view.root} ({view.describe().split('; ', 1)[1]})\n" + render_report(report))


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
