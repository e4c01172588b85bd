"""`topoctl allocate | release | renew | leases | watch | run | status`: the daemon's clients."""

from __future__ import annotations

import argparse
import json
import os
import sys


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", default=None, help="daemon socket (default $TOPOD_SOCKET or /run/topod/topod.sock)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _request_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    parser.add_argument("--level", choices=("best", "good", "any"), default=None)
    parser.add_argument("--priority", type=int, default=None)
    parser.add_argument("--cpus-per-gpu", type=int, default=None)
    parser.add_argument("--must-include", default=None, help="comma-separated GPU indices")
    parser.add_argument("--min-memory-mib", type=int, default=None)
    parser.add_argument("--model", default=None, help="GPU model substring")
    parser.add_argument("--preemptible", action="store_true")
    parser.add_argument("--ttl", type=float, default=None, help="lease ends after this many seconds")
    parser.add_argument("--wait", type=float, default=0.0, help="queue up to this many seconds (0 = fail fast)")
    parser.add_argument("--job", default=None, help="free-form job label")


def register(subparsers: argparse._SubParsersAction) -> None:
    allocate = subparsers.add_parser("allocate", help="lease GPUs with their near cores and memory")
    _common(allocate)
    _request_args(allocate)
    allocate.add_argument("--owner-pid", type=int, default=None, help="lease ends when this process exits")
    allocate.set_defaults(handler=run_allocate)

    release = subparsers.add_parser("release", help="end a lease")
    _common(release)
    release.add_argument("lease")
    release.set_defaults(handler=run_release)

    renew = subparsers.add_parser("renew", help="extend a lease's ttl")
    _common(renew)
    renew.add_argument("lease")
    renew.add_argument("--ttl", type=float, default=None)
    renew.set_defaults(handler=run_renew)

    leases = subparsers.add_parser("leases", help="list leases")
    _common(leases)
    leases.set_defaults(handler=run_leases)

    watch = subparsers.add_parser("watch", help="follow the daemon's events")
    _common(watch)
    watch.add_argument("--count", type=int, default=0, help="stop after this many events")
    watch.set_defaults(handler=run_watch)

    status = subparsers.add_parser("status", help="the daemon's health")
    _common(status)
    status.set_defaults(handler=run_status)

    run = subparsers.add_parser("run", help="allocate, run a command pinned to the lease, release")
    _common(run)
    _request_args(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    run.set_defaults(handler=run_run)


def _client(args):
    from topod.client import Client

    return Client(args.socket)


def _request_body(args) -> dict:
    body: dict = {}
    for key, value in (("level", args.level), ("priority", args.priority), ("cpus_per_gpu", args.cpus_per_gpu),
                       ("min_memory_mib", args.min_memory_mib), ("model", args.model), ("job", args.job),
                       ("ttl_seconds", args.ttl)):
        if value is not None:
            body[key] = value
    if args.must_include:
        body["must_include"] = [int(x) for x in args.must_include.split(",")]
    if args.preemptible:
        body["preemptible"] = True
    if args.wait:
        body["wait"] = args.wait
    return body


def _print_lease(lease: dict) -> None:
    from topod.cpulist import format_cpulist

    decision = lease.get("decision", {})
    state = "" if lease.get("state", "active") == "active" else f"  state {lease['state']}"
    print(f"lease {lease['id']}  gpus {','.join(map(str, lease['gpus']))}  level {decision.get('level')}  "
          f"cost {decision.get('cost')}  satisfaction {decision.get('satisfaction')}{state}")
    if lease.get("missing_gpus"):
        print(f"  missing GPU(s): {','.join(map(str, lease['missing_gpus']))} (gone from this host)")
    for gpu in lease.get("placements", []):
        print(f"  GPU{gpu.get('index')} {gpu.get('address')} node {gpu.get('numa_node')} "
              f"cpus {format_cpulist(gpu.get('cpus', []))}")
    env = lease.get("environment", {})
    if env:
        print("  " + " ".join(f"{k}={v}" for k, v in env.items()))


def run_allocate(args) -> int:
    body = _request_body(args)
    if args.owner_pid:
        body["owner_pid"] = args.owner_pid
    lease = _client(args).allocate(args.gpus, **body)
    if args.json:
        print(json.dumps(lease, indent=2))
    else:
        _print_lease(lease)
    return 0


def run_release(args) -> int:
    result = _client(args).release(args.lease)
    print(json.dumps(result) if args.json else f"released {result['released']} (GPUs {result['gpus']})")
    return 0


def run_renew(args) -> int:
    lease = _client(args).renew(args.lease, args.ttl)
    print(json.dumps(lease, indent=2) if args.json else f"renewed {lease['id']} until {lease['expires']}")
    return 0


def run_leases(args) -> int:
    leases = _client(args).leases()
    if args.json:
        print(json.dumps(leases, indent=2))
        return 0
    if not leases:
        print("no leases")
        return 0
    print(f"{'ID':<18}{'STATE':<12}{'UID':>6}  {'PRIO':>4}  {'GPUS':<16}{'LEVEL':<6}{'JOB'}")
    for lease in leases:
        print(f"{lease['id']:<18}{lease['state']:<12}{lease['owner_uid']:>6}  {lease['priority']:>4}  "
              f"{','.join(map(str, lease['gpus'])):<16}{lease['decision'].get('level', ''):<6}{lease.get('job') or ''}")
    return 0


def run_watch(args) -> int:
    seen = 0
    for event in _client(args).events():
        if args.json:
            print(json.dumps(event), flush=True)
        else:
            fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "time"))
            print(f"{event['event']} {fields}", flush=True)
        seen += 1
        if args.count and seen >= args.count:
            break
    return 0


def run_status(args) -> int:
    health = _client(args).health()
    if args.json:
        print(json.dumps(health, indent=2))
    else:
        print(f"topod {health['version']}: {health['status']}, {health['leases']} lease(s), "
              f"{health['gpus_free']}/{health['gpus']} GPU(s) free, {health['waiting']} waiting")
    return 0 if health["status"] == "ok" else 1


def run_run(args) -> int:
    from topod.cpulist import parse_cpulist
    from topod.membind import bind_memory

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("topoctl run: no command given (topoctl run --gpus N -- CMD ...)", file=sys.stderr)
        return 2
    client = _client(args)
    body = _request_body(args)
    body["owner_pid"] = os.getpid()
    lease = client.allocate(args.gpus, **body)
    env = dict(os.environ)
    env.update(lease.get("environment", {}))
    cpus = parse_cpulist(env.get("TOPOD_CPUS", "")) or None
    nodes = [int(n) for n in env.get("TOPOD_MEMORY_NODES", "").split(",") if n]

    def pin() -> None:
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError as exc:  # the lease names CPUs this kernel does not have online
                os.write(2, f"topoctl run: CPUs not pinned: {exc}\n".encode())
        if nodes:
            try:
                bind_memory(nodes)
            except OSError as exc:
                print(f"topoctl run: memory not bound: {exc}", file=sys.stderr)

    import subprocess

    try:
        completed = subprocess.run(command, env=env, preexec_fn=pin)  # noqa: PLW1509 - pinning must precede exec
        code = completed.returncode
    except FileNotFoundError:
        print(f"topoctl run: {command[0]}: command not found", file=sys.stderr)
        code = 127
    finally:
        try:
            client.release(lease["id"])
        except Exception:  # noqa: BLE001 - owner_pid reclaims it when we exit anyway
            pass
    return code if code >= 0 else 128 - code
