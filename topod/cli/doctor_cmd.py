"""`topoctl doctor`: is each GPU process placed where its GPUs are?

Works without a daemon (pure host-root analysis). Lease and IRQ-plan data come in as
plain values: from the daemon (the lead's API client fills `fetch_daemon_data`), or from
--leases-file / --irq-plan-file for offline use and tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# Exit status when doctor finds an error or warning (0: healthy; 1: doctor itself failed).
EXIT_FINDINGS = 3


def register(subparsers: argparse._SubParsersAction) -> None:
    doctor = subparsers.add_parser("doctor", help="check GPU processes' CPU, memory and IRQ placement")
    doctor.add_argument("--pid", type=int, action="append", default=None, metavar="PID",
                        help="process to check (repeatable); default: every process holding a GPU open")
    doctor.add_argument("--lease", action="append", default=None, metavar="ID",
                        help="check the processes of this lease (repeatable; needs lease data)")
    doctor.add_argument("--root", default="/", help="host root (a captured tree); default /")
    doctor.add_argument("--json", action="store_true", help="machine-readable findings")
    doctor.add_argument("--irq-interval", type=float, default=0.0, metavar="SECONDS",
                        help="sample /proc/interrupts twice this far apart to measure IRQ rates "
                             "(default 0: judge IRQs by affinity only)")
    doctor.add_argument("--leases-file", default=None, metavar="FILE",
                        help="JSON list of leases {id, owner, gpus, cpus, pids} (instead of asking the daemon)")
    doctor.add_argument("--irq-plan-file", default=None, metavar="FILE",
                        help="JSON object {irq: [cpus]}: where the IRQ plan puts each vector")
    doctor.add_argument("--verbose", "-v", action="store_true", help="list every file each finding read")
    doctor.add_argument("--socket", default=None,
                        help="ask this daemon for leases and the IRQ plan (default $TOPOD_SOCKET or "
                             "/run/topod/topod.sock when it exists; none: host-only checks)")
    doctor.set_defaults(handler=run_doctor)


def fetch_daemon_data(args: argparse.Namespace) -> tuple[list[dict] | None, dict | None]:
    """(leases, irq_plan) from a running daemon, or (None, None) when there is none.

    Doctor never needs the daemon; with one, leases and the IRQ plan sharpen the checks."""
    import os

    from topod.client import ApiError, Client, default_socket

    path = getattr(args, "socket", None) or default_socket()
    if not os.path.exists(path):
        return None, None
    client = Client(path, timeout=5)
    try:
        leases = [{"id": lease["id"], "owner": str(lease.get("job") or lease["owner_uid"]), "gpus": lease["gpus"],
                   "cpus": lease["cpus"], "pids": [p for p in (lease.get("owner_pid"),) if p]}
                  for lease in client.leases()]
        report = client.request("GET", "/v1/irqs")
    except ApiError:
        return None, None
    plan = {str(entry["irq"]): entry.get("planned") or entry.get("current") or []
            for entry in report.get("irqs", [])}
    return leases, plan or None


def _load_json(path: str, what: str) -> object:
    from topod.doctor import DoctorInputError

    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as exc:
        raise DoctorInputError(f"{what} {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise DoctorInputError(f"{what} {path}: not JSON ({exc.msg} at line {exc.lineno})") from exc


def gather_inputs(args: argparse.Namespace) -> tuple[list[dict] | None, dict | None]:
    from topod.doctor import DoctorInputError

    leases, plan = fetch_daemon_data(args)
    if args.leases_file:
        leases = _load_json(args.leases_file, "--leases-file")
        if not isinstance(leases, list):
            raise DoctorInputError(f"--leases-file {args.leases_file}: expected a JSON list of leases")
    if args.irq_plan_file:
        plan = _load_json(args.irq_plan_file, "--irq-plan-file")
        if not isinstance(plan, dict):
            raise DoctorInputError(f"--irq-plan-file {args.irq_plan_file}: expected a JSON object {{irq: [cpus]}}")
    return leases, plan


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
    from topod.discover import discover
    from topod.doctor import diagnose, render_text, report_to_json
    from topod.host import HostRoot

    host = HostRoot(args.root)
    topology = discover(host)
    leases, plan = gather_inputs(args)
    pids = list(args.pid or [])
    if args.lease:
        pids += pids_of_leases(args.lease, leases)
    report = diagnose(host, topology, pids=pids if (args.pid or args.lease) else None, leases=leases,
                      irq_plan=plan, interrupts=sample_interrupts(host, args.irq_interval))
    if args.json:
        json.dump(report_to_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report, verbose=args.verbose))
    return 0 if report.healthy else EXIT_FINDINGS
