"""`topoctl irq plan` and `topoctl irq apply --oneshot`: the IRQ balancer run by hand.

With a daemon serving the same root, its leased CPUs are kept clear like --leased-cpus,
its [irq] settings (banned and housekeeping CPUs, policies, overrides; GET /v1/irqs
"settings") are the ones planned with, and `apply` refuses to write while that daemon
balances the root continuously (it would undo the daemon's placement, or the daemon would
undo ours) unless --force. Without one, --config's [irq] or the defaults, said in one
line. --banned-cpus, --housekeeping-cpus and --irqbalance go on top of either.
Arguments: topod.cli.commands."""

from __future__ import annotations

import argparse
import json
import sys
import time

from topod.jsonindent import dumps_indented


class SettingsSource:
    """Where the [irq] settings came from: kind daemon | config | defaults, and words."""

    def __init__(self, kind: str, text: str, note: str = "") -> None:
        self.kind = kind
        self.text = text
        self.note = note  # said on stderr: why not the daemon's

    def to_json(self, settings) -> dict:  # noqa: ANN001 - IrqSettings
        from topod.cpulist import format_cpulist

        return {"source": self.kind, "from": self.text, "banned_cpus": format_cpulist(sorted(settings.banned_cpus)),
                "housekeeping_cpus": format_cpulist(sorted(settings.housekeeping_cpus)),
                "irqbalance": settings.irqbalance, "policy": dict(settings.policy)}


def _daemon_section(view) -> tuple[dict | None, str]:  # noqa: ANN001 - DaemonView
    """The serving daemon's effective [irq] (GET /v1/irqs "settings"), or None and why not."""
    from topod.client import ApiError

    try:
        report = view.client.request("GET", "/v1/irqs")
    except ApiError as exc:
        return None, f"topod at {view.socket} gave no [irq] settings ({exc})"
    section = report.get("settings") if isinstance(report, dict) else None
    if not isinstance(section, dict):
        return None, f"topod at {view.socket} does not report its [irq] settings (an older topod)"
    return section, ""


def _settings(args: argparse.Namespace, view):  # noqa: ANN001, ANN202 - DaemonView; (IrqSettings, SettingsSource)
    """--config's [irq] when given, else the serving daemon's, else the defaults; the
    command line's overrides on top."""
    from topod.errors import ConfigError
    from topod.irq import IrqSettings

    section: dict = {}
    if args.config:
        from topod.config import load_config

        section = load_config(args.config).section("irq")
        note = f"[irq] from --config {args.config}, not from topod at {view.socket}" if view.serves_root else ""
        source = SettingsSource("config", f"--config {args.config}", note)
    elif view.serves_root:
        daemon, why = _daemon_section(view)
        if daemon is not None:
            section = daemon
            source = SettingsSource("daemon", f"topod at {view.socket}")
        else:
            source = SettingsSource("defaults", "defaults", f"{why}: planning with the default [irq] settings")
    else:
        source = SettingsSource("defaults", "defaults", "no daemon's [irq] settings: planning with the defaults "
                                                        "(--config FILE for a config's)")
    given = [(key, value) for key, value in (("banned_cpus", args.banned_cpus),
                                             ("housekeeping_cpus", args.housekeeping_cpus),
                                             ("irqbalance", args.irqbalance)) if value is not None]
    for key, value in given:
        section[key] = value
    if given:
        source.text += " and " + ", ".join(f"--{key.replace('_', '-')} {value}" for key, value in given)
    try:
        return IrqSettings.from_section(section), source
    except ConfigError as exc:
        if source.kind == "daemon":
            raise ConfigError(f"the [irq] settings of topod at {view.socket}: {exc}") from exc
        raise


def _say(note: str, as_json: bool) -> None:
    if as_json:
        sys.stderr.write(json.dumps({"note": note}) + "\n")
    else:
        sys.stderr.write(f"topoctl: {note}\n")


def _leased(args: argparse.Namespace) -> list[int]:
    from topod.cpulist import parse_cpulist
    from topod.errors import ConfigError

    try:
        return parse_cpulist(args.leased_cpus)
    except ValueError as exc:
        raise ConfigError(f"--leased-cpus: {exc}") from exc


def _view(args: argparse.Namespace):  # noqa: ANN202 - (DaemonView, IrqSettings, settings JSON)
    """The root and daemon, and the settings to plan with, said on stderr: where no
    daemon serves the root, in the one line that says so."""
    from topod.cli.daemon_view import find

    view = find(args)
    settings, source = _settings(args, view)
    if source.note and not view.serves_root:
        view.note = f"{view.note}; {source.note}"
    view.announce(args.json)
    if source.note and view.serves_root:
        _say(source.note, args.json)
    return view, settings, source.to_json(settings)


def _setup(view, settings, leased: list[int]):  # noqa: ANN001, ANN202 - DaemonView, IrqSettings
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.irq import IrqBalancer

    host = HostRoot(view.root)
    return IrqBalancer(host, settings), discover(host), sorted(set(leased) | view.leased_cpus())


def run_plan(args: argparse.Namespace) -> int:
    own = _leased(args)
    view, settings, shown = _view(args)
    balancer, topology, leased = _setup(view, settings, own)
    if args.interval > 0:
        balancer.cycle(topology, leased, mode="dry-run")
        time.sleep(args.interval)
    report = balancer.cycle(topology, leased, mode="dry-run")
    _print(report, args.json, view, shown)
    return 0


def run_apply(args: argparse.Namespace) -> int:
    from topod.errors import ConfigError

    if not args.oneshot:
        raise ConfigError("topoctl irq apply needs --oneshot (continuous balancing runs inside topod)")
    own = _leased(args)
    view, settings, shown = _view(args)
    if view.serves_root and view.irq_mode == "continuous" and not args.dry_run and not args.force:
        raise ConfigError(f"topod at {view.socket} balances the IRQs of {view.root} continuously "
                          "(irq.mode continuous): a one-shot apply would fight it. See its plan with "
                          "`topoctl irq plan`, set [irq] mode = \"dry-run\" or \"off\", or pass --force")
    withheld = None if args.dry_run or args.allow_in_container else _container_withholds(view.root)
    if withheld:
        _say(withheld, args.json)
    balancer, topology, leased = _setup(view, settings, own)
    report = balancer.cycle(topology, leased, mode="dry-run" if args.dry_run or withheld else "continuous")
    _print(report, args.json, view, shown, withheld)
    return 1 if withheld else 0


def _container_withholds(root: str) -> str | None:
    """The daemon's container check (topod.service.container): a container may see the
    host's /proc/irq, and moving the host's IRQs from inside one is never what is meant."""
    from topod.host import HostRoot
    from topod.service.container import detect_container

    container = detect_container(HostRoot(root))
    if container is None:
        return None
    return (f"{root} is a container ({container}): IRQ affinity planned, nothing written; "
            "pass --allow-in-container to write it")


def _print(report, as_json: bool, view, settings: dict,  # noqa: ANN001 - CycleReport, DaemonView
           withheld: str | None = None) -> None:
    if as_json:
        document = report.to_json()
        document.setdefault("root", view.root)
        document["settings"] = settings
        if withheld:
            document["withheld"] = withheld
        sys.stdout.write(dumps_indented(document) + "\n")
        return
    sys.stdout.write(f"root {view.root} ({view.describe().split('; ', 1)[1]})\n"
                     f"[irq] settings from {settings['from']}: banned CPUs {settings['banned_cpus'] or '-'}, "
                     f"housekeeping CPUs {settings['housekeeping_cpus'] or '-'}, irqbalance {settings['irqbalance']}\n"
                     + render_report(report))


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
