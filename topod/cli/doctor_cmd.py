"""`topoctl doctor`: is each GPU process placed where its GPUs are?

Works without a daemon (pure host-root analysis). Lease and IRQ-plan data come in as
plain values: from the daemon serving the same root (`daemon_data`), or from
--leases-file / --irq-plan-file for offline use and tests. Arguments: topod.cli.commands.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from topod.jsonindent import dumps_indented

# Exit status when doctor finds an error or warning (0: healthy; 1: doctor itself failed).
EXIT_FINDINGS = 3


def daemon_data(view) -> tuple[list[dict] | None, dict | None, dict | None]:  # noqa: ANN001 - DaemonView
    """(leases, irq_plan, health) from the daemon serving the view's root, or Nones.

    Doctor never needs the daemon; with one, leases and the IRQ plan sharpen the checks.
    A daemon serving another root is ignored: its leases say nothing about this tree."""
    from topod.client import ApiError

    if not view.serves_root:
        return None, None, None
    try:
        leases = [{"id": lease["id"], "owner": str(lease.get("job") or lease["owner_uid"]), "gpus": lease["gpus"],
                   "cpus": lease["cpus"], "pids": [p for p in (lease.get("owner_pid"),) if p]}
                  for lease in view.leases()]
        report = view.client.request("GET", "/v1/irqs")
        health = view.client.health()
    except ApiError:
        return None, None, None
    plan = {str(entry["irq"]): entry.get("planned") or entry.get("current") or []
            for entry in report.get("irqs", [])}
    return leases, plan or None, health


def _load_json(path: str, what: str) -> object:
    from topod.doctor import DoctorInputError

    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as exc:
        raise DoctorInputError(f"{what} {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise DoctorInputError(f"{what} {path}: not JSON ({exc.msg} at line {exc.lineno})") from exc


def gather_inputs(args: argparse.Namespace, view) -> tuple[list[dict] | None, dict | None, dict | None]:  # noqa: ANN001
    from topod.doctor import DoctorInputError

    leases, plan, health = daemon_data(view)
    if args.leases_file:
        leases = _load_json(args.leases_file, "--leases-file")
        if not isinstance(leases, list):
            raise DoctorInputError(f"--leases-file {args.leases_file}: expected a JSON list of leases")
    if args.irq_plan_file:
        plan = _load_json(args.irq_plan_file, "--irq-plan-file")
        if not isinstance(plan, dict):
            raise DoctorInputError(f"--irq-plan-file {args.irq_plan_file}: expected a JSON object {{irq: [cpus]}}")
    return leases, plan, health


def pids_of_leases(wanted: list[str], leases: list[dict] | None) -> list[int]:
    from topod.doctor import DoctorInputError

    if leases is None:
        raise DoctorInputError("--lease needs lease data: start topod, or pass --leases-file FILE")
    known = {str(item.get("id")): item for item in leases if isinstance(item, dict)}
    pids: list[int] = []
    for lease_id in wanted:
        if lease_id not in known:
            raise DoctorInputError(f"no lease {lease_id!r}; known: {', '.join(sorted(known)) or 'none'}")
        pids.extend(int(p) for p in known[lease_id].get("pids", []))
    return pids


def sample_interrupts(host, seconds: float) -> tuple[str, str, float] | None:
    from topod.doctor import DoctorInputError

    if seconds <= 0:
        return None
    before = host.read("proc/interrupts")
    if before is None:
        raise DoctorInputError(f"--irq-interval: {host.root}/proc/interrupts is not readable")
    start = time.monotonic()
    time.sleep(seconds)
    after = host.read("proc/interrupts") or before
    return before, after, time.monotonic() - start


def run_doctor(args: argparse.Namespace) -> int:
    from topod.cli.daemon_view import find
    from topod.discover import discover
    from topod.doctor import diagnose, render_text, report_to_json
    from topod.host import HostRoot

    view = find(args)
    view.announce(args.json)
    host = HostRoot(view.root)
    topology = discover(host)
    leases, plan, health = gather_inputs(args, view)
    pids = list(args.pid or [])
    if args.lease:
        pids += pids_of_leases(args.lease, leases)
    report = diagnose(host, topology, pids=pids if (args.pid or args.lease) else None, leases=leases,
                      irq_plan=plan, interrupts=sample_interrupts(host, args.irq_interval), daemon_health=health)
    if args.json:
        sys.stdout.write(dumps_indented(report_to_json(report)) + "\n")
    else:
        sys.stdout.write(render_text(report, verbose=args.verbose))
    return 0 if report.healthy else EXIT_FINDINGS
