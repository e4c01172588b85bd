"""`topoctl allocate | release | renew | leases | watch | run | status | reload`: the daemon's clients.

Arguments: topod.cli.commands. Text output shows times as ISO 8601 local time; --json
keeps the API's numbers (seconds since the epoch)."""

from __future__ import annotations

import json
import os
import sys

from topod.jsonindent import dumps_indented


def local_time(seconds: float | None) -> str:
    """ISO 8601 in local time with its UTC offset, to the second: 2025-03-01T14:05:09+01:00."""
    if seconds is None:
        return "-"
    from datetime import datetime

    return datetime.fromtimestamp(float(seconds)).astimezone().isoformat(timespec="seconds")


def _client(args):
    from topod.client import Client

    return Client(args.socket)


def _gpus(args) -> int:
    """--gpus N; left out with --cpus, 0 (a lease without GPUs); neither is a usage error."""
    if args.gpus is not None:
        return args.gpus
    if getattr(args, "cpus", None) is None:
        from topod.cli.exits import UsageError

        raise UsageError("give --gpus N, or --cpus N for a lease without GPUs")
    return 0


def _request_body(args) -> dict:
    body: dict = {}
    for key, value in (("level", args.level), ("priority", args.priority), ("cpus_per_gpu", args.cpus_per_gpu),
                       ("min_memory_mib", args.min_memory_mib), ("model", args.model), ("job", args.job),
                       ("ttl_seconds", args.ttl), ("nics_per_gpu", getattr(args, "nics_per_gpu", None)),
                       ("cpus", getattr(args, "cpus", None)), ("near", getattr(args, "near", None))):
        if value is not None:
            body[key] = value
    if args.must_include:
        body["must_include"] = args.must_include
    if args.preemptible:
        body["preemptible"] = True
    if args.wait:
        body["wait"] = args.wait
    return body


def _print_lease(lease: dict) -> None:
    from topod.cpulist import format_cpulist

    decision = lease.get("decision", {})
    state = "" if lease.get("state", "active") == "active" else f"  state {lease['state']}"
    if lease.get("gpus"):
        print(f"lease {lease['id']}  gpus {','.join(map(str, lease['gpus']))}  level {decision.get('level')}  "
              f"cost {decision.get('cost')}  satisfaction {decision.get('satisfaction')}{state}")
    else:  # a lease without GPUs: its CPUs and where they are
        near = f"  near {decision['near']}" if decision.get("near") else ""
        print(f"lease {lease['id']}  no GPUs  cpus {format_cpulist(lease.get('cpus', [])) or '-'}  memory nodes "
              f"{','.join(map(str, lease.get('memory_nodes', []))) or '-'}{near}  level {decision.get('level')}{state}")
    if lease.get("created") is not None:
        expires = local_time(lease.get("expires")) if lease.get("expires") is not None else "never (no ttl)"
        print(f"  created {local_time(lease['created'])}  expires {expires}")
    if lease.get("missing_gpus"):
        print(f"  missing GPU(s): {','.join(map(str, lease['missing_gpus']))} (gone from this host)")
    for gpu in lease.get("placements", []):
        nics = ",".join(f"{nic['name']}:{nic['port']} ({nic['level']})" for nic in gpu.get("nics") or ())
        print(f"  GPU{gpu.get('index')} {gpu.get('address')} node {gpu.get('numa_node')} "
              f"cpus {format_cpulist(gpu.get('cpus', []))}" + (f"  nic {nics}" if nics else ""))
    env = lease.get("environment", {})
    if env:
        print("  " + " ".join(f"{k}={v}" for k, v in env.items()))


def run_allocate(args) -> int:
    body = _request_body(args)
    if args.owner_pid:
        body["owner_pid"] = args.owner_pid
    lease = _client(args).allocate(_gpus(args), **body)
    if args.json:
        print(dumps_indented(lease))
    else:
        _print_lease(lease)
    return 0


def run_release(args) -> int:
    result = _client(args).release(args.lease)
    print(json.dumps(result) if args.json else f"released {result['released']} (GPUs {result['gpus']})")
    return 0


def run_revoke(args) -> int:
    result = _client(args).revoke(args.lease)
    print(json.dumps(result) if args.json else f"revoked {result['revoked']} (GPUs {result['gpus']})")
    return 0


def run_scope(args) -> int:
    """topoctl scope LEASE PID: the process joins the lease's scope; the exit status says
    whether it did (an API error exits as every command's does), stderr what holds its CPUs."""
    answer = _client(args).place_in_scope(args.lease, args.pid)
    if args.json:
        print(json.dumps(answer))
    else:
        print(f"pid {answer['pid']} in {answer['scope']} ({'new' if answer['created'] else 'joined'}); "
              f"enforcement {answer['enforcement']}")
    if answer["enforcement"] != "cgroup":
        print(f"topoctl scope: {answer['reason']}", file=sys.stderr)
    return 0


def run_renew(args) -> int:
    lease = _client(args).renew(args.lease, args.ttl)
    print(dumps_indented(lease) if args.json else f"renewed {lease['id']} until {local_time(lease['expires'])}")
    return 0


def _print_lease_detail(lease: dict) -> None:
    """One lease, whole: who holds it, its GPUs with their CPUs and NICs, all its CPUs and
    memory nodes, and the environment a job runs with (one variable a line)."""
    from topod.cpulist import format_cpulist

    decision = lease.get("decision", {})
    print(f"lease {lease['id']}  state {lease.get('state', 'active')}  uid {lease.get('owner_uid')}  "
          f"priority {lease.get('priority', 0)}{'  preemptible' if lease.get('preemptible') else ''}"
          + (f"  job {lease['job']}" if lease.get("job") else ""))
    expires = local_time(lease.get("expires")) if lease.get("expires") is not None else "never (no ttl)"
    print(f"  created {local_time(lease.get('created'))}  expires {expires}"
          + (f"  owner pid {lease['owner_pid']}" if lease.get("owner_pid") else ""))
    print(f"  gpus {','.join(map(str, lease.get('gpus', []))) or '-'}  level {decision.get('level')}"
          + (f"  near {decision['near']}" if decision.get("near") else ""))
    print(f"  cpus {format_cpulist(lease.get('cpus', [])) or '-'}  memory nodes "
          f"{','.join(map(str, lease.get('memory_nodes', []))) or '-'}")
    if lease.get("missing_gpus"):
        print(f"  missing GPU(s): {','.join(map(str, lease['missing_gpus']))} (gone from this host)")
    for gpu in lease.get("placements", []):
        nics = ", ".join(f"{nic['name']}:{nic['port']} ({nic['level']})" for nic in gpu.get("nics") or ())
        print(f"  GPU{gpu.get('index')} {gpu.get('address')} node {gpu.get('numa_node')} "
              f"cpus {format_cpulist(gpu.get('cpus', []))}  nics {nics or '-'}")
    env = lease.get("environment", {})
    if env:
        print("  environment:")
        for key, value in env.items():
            print(f"    {key}={value}")


def run_leases(args) -> int:
    if getattr(args, "lease", None):
        lease = _client(args).lease(args.lease)
        if args.json:
            sys.stdout.write(dumps_indented(lease) + "\n")
        else:
            _print_lease_detail(lease)
        return 0
    leases = _client(args).leases()
    if args.json:
        sys.stdout.write(dumps_indented(leases) + "\n")
        return 0
    if not leases:
        print("no leases")
        return 0
    rows = [f"{'ID':<18}{'STATE':<12}{'UID':>6}  {'PRIO':>4}  {'GPUS':<16}{'LEVEL':<6}{'CREATED':<26}"
            f"{'EXPIRES':<26}JOB"]
    for lease in leases:
        rows.append(f"{lease['id']:<18}{lease['state']:<12}{lease['owner_uid']:>6}  {lease['priority']:>4}  "
                    f"{','.join(map(str, lease['gpus'])) or '-':<16}{lease['decision'].get('level', ''):<6}"
                    f"{local_time(lease.get('created')):<26}{local_time(lease.get('expires')):<26}"
                    f"{lease.get('job') or ''}")
    sys.stdout.write("\n".join(rows) + "\n")
    return 0


def run_status(args) -> int:
    health = _client(args).health()
    if args.json:
        print(dumps_indented(health))
    else:
        print(f"topod {health['version']}: {health['status']}, {health['leases']} lease(s), "
              f"{health['gpus_free']}/{health['gpus']} GPU(s) free, {health['waiting']} waiting")
        for reason in health.get("degraded") or ():  # why, one line each
            print(f"  degraded: {reason}")
    return 0 if health["status"] == "ok" else 1


RELOAD_TIMEOUT_SECONDS = 120.0  # a reload reads the file and may look a group up in the name service


def run_reload(args) -> int:
    """Ask the daemon to reload its config file and wait for the verdict (the unit's
    ExecReload=): 0 applied, 1 refused (the running config is kept) with the reason."""
    verdict = _client(args).request("POST", "/v1/reload", timeout=RELOAD_TIMEOUT_SECONDS)
    restart = verdict.get("restart_required") or []
    if args.json:
        print(dumps_indented(verdict))
    elif verdict.get("applied"):
        print(f"topod: config {verdict.get('path')} applied")
    if not verdict.get("applied"):
        print(f"topoctl: reload refused, the running config is kept: {verdict.get('reason')}", file=sys.stderr)
        return 1
    if restart:
        print(f"topoctl: changed but read only at start (kept until topod restarts): {', '.join(restart)}",
              file=sys.stderr)
    return 0


def _gpu_numbers(client, gpus: list[int]) -> tuple[int | str, ...]:
    """N of each leased GPU's /dev/nvidiaN: the daemon's device minor, else the index; an
    AMD GPU's render node path (/dev/dri/renderDN) instead."""
    try:
        minors = {g["index"]: _device_of(g) for g in client.topology().get("gpus", [])}
    except Exception:  # noqa: BLE001 - the index is the model's own fallback (Gpu.device_number)
        minors = {}
    return tuple(minors.get(i) if minors.get(i) is not None else i for i in gpus)


def _device_of(gpu: dict) -> int | str | None:
    amd = gpu.get("amd") or {}
    if amd.get("render_minor") is not None:
        return f"/dev/dri/renderD{int(amd['render_minor'])}"
    return gpu.get("minor")


def _enclose(client, lease: dict, pid: int, cpus: list[int] | None, nodes: list[int]) -> dict:
    """Put `pid` in the lease's transient scope (topod.scope) where systemd answers on the
    system bus; what holds the lease, never more than was done: cgroup only when the scope
    was created on a host whose cgroups enforce its AllowedCPUs=."""
    from topod.cpulist import format_cpulist
    from topod.enforce import host_enforcement, lease_mode
    from topod.host import HostRoot
    from topod.scope import ScopeError, ScopeSpec, control_nodes, device_allow, start_scope

    live = HostRoot("/")
    host = host_enforcement(live)
    spec = ScopeSpec(lease_id=lease["id"], pid=pid, cpus=tuple(cpus or ()), memory_nodes=tuple(nodes),
                     gpu_numbers=_gpu_numbers(client, list(lease.get("gpus", []))),
                     controls=tuple(control_nodes(live)), job=lease.get("job"))
    scope = {"unit": spec.name, "created": False, "reason": None,
             "AllowedCPUs": format_cpulist(spec.cpus) if spec.cpus else None,
             "AllowedMemoryNodes": format_cpulist(spec.memory_nodes) if spec.memory_nodes else None,
             "DevicePolicy": "closed",
             "DeviceAllow": [f"{path} {access}" for path, access in device_allow(spec.gpu_numbers, spec.controls)]}
    placed: dict | None = None  # topod's answer once it has made the scope and recorded it on the lease
    try:
        # topod makes the scope (any member may ask for its own child) and records it on the
        # lease, so the lease, health and this answer say the same, and a revoke stops it.
        placed = client.place_in_scope(lease["id"], pid)
        scope.update(created=True, reason=None, by="topod")
    except Exception as refused:  # noqa: BLE001 - an older topod, a captured tree's, none on the bus: said
        scope["reason"] = f"topod did not place it ({refused})"
        try:
            start_scope(spec)
            scope.update(created=True, reason=None, by="topoctl", recorded=f"not on the lease: {refused}")
        except ScopeError as exc:
            scope["reason"] += f"; nor did systemd for topoctl: {exc}"
    # sched_setaffinity takes a mask that names at least one CPU this process may use; a
    # lease from another host's tree may name none here, and then nothing is pinned.
    pinnable = bool(cpus) and bool(set(cpus) & os.sched_getaffinity(0))
    # What holds the job is what the lease says it gets (the daemon's word, never more).
    if placed is not None:
        mode = placed.get("lease_enforcement") or placed.get("enforcement") or "none"
    elif scope["created"] and host.mode == "cgroup" and cpus:
        mode = "cgroup"  # a scope of topoctl's own, on a host whose cgroups hold it
    else:
        mode = lease.get("enforcement") or lease_mode(host.mode, pinnable)
    if mode == "affinity" and not pinnable:
        mode = "none"
    if mode == "cgroup":
        reason = f"runs in {spec.name}: cgroup v2 cpuset holds its CPUs and memory nodes"
    elif not pinnable and cpus:
        reason = f"none of the lease's CPUs ({format_cpulist(cpus)}) is available to this process: nothing is pinned"
    elif mode == "none":
        reason = ("the lease says topod enforces nothing for it (a captured host tree's lease, or no CPUs); "
                  "pinned here by sched_setaffinity only")
    elif not scope["created"]:
        reason = (f"no systemd scope ({scope['reason']}); CPUs held by sched_setaffinity only (the job may undo "
                  "it), GPUs by CUDA_VISIBLE_DEVICES only")
    else:
        reason = (f"runs in {spec.name}, but its AllowedCPUs=/AllowedMemoryNodes= are only recorded here "
                  f"({host.reason}); CPUs held by sched_setaffinity")
    return {"lease": lease["id"], "gpus": lease.get("gpus", []), "enforcement": mode, "reason": reason,
            "host_enforcement": host.mode, "scope": scope}


def _child(go: int, command: list[str], env: dict, pin, journal=None) -> None:
    """In the forked child: wait until the parent has put this process in its scope (or
    given up on one), pin, connect the output to the journal (from inside the scope, so
    journald files it under the scope's unit), exec. Never returns; EOF (the parent died)
    runs nothing."""
    code = 127
    try:
        if os.read(go, 1) != b"g":
            os._exit(125)
        os.close(go)
        pin()
        if journal is not None:
            try:
                journal()
            except OSError as exc:
                os.write(2, f"topoctl run: --journal: {exc.strerror or exc}\n".encode())
                os._exit(126)
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        os.write(2, f"topoctl run: {command[0]}: command not found\n".encode())
    except OSError as exc:
        os.write(2, f"topoctl run: {command[0]}: {exc.strerror}\n".encode())
        code = 126
    except BaseException:  # noqa: BLE001 - nothing may unwind into the parent's code
        code = 125
    os._exit(code)


def _wait(pid: int) -> int:
    """The child's exit code (-N for signal N); a second Ctrl-C kills it (the first
    reached it too, as the foreground process group)."""
    import signal

    interrupted = False
    while True:
        try:
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except KeyboardInterrupt:
            if interrupted:
                os.kill(pid, signal.SIGKILL)
            interrupted = True


def run_run(args) -> int:
    from topod.cpulist import parse_cpulist
    from topod.membind import bind_memory

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("topoctl run: no command given (topoctl run --gpus N -- CMD ..., or --cpus N)", file=sys.stderr)
        return 2
    journal = None
    if getattr(args, "journal", False):
        from topod import journalstream

        try:  # before a lease is taken: no journald, no run
            journalstream.check()
        except OSError as exc:
            print(f"topoctl run: --journal: {exc.strerror or exc}", file=sys.stderr)
            return 1
        identifier = (args.job or os.path.basename(command[0]) or "topoctl-run").replace("\n", " ")

        def journal() -> None:
            journalstream.redirect(identifier, unit)
    client = _client(args)
    body = _request_body(args)
    body["owner_pid"] = os.getpid()
    lease = client.allocate(_gpus(args), **body)
    from topod.scope import unit_name

    unit = unit_name(lease["id"])
    env = dict(os.environ)
    env.update(lease.get("environment", {}))
    cpus = parse_cpulist(env.get("TOPOD_CPUS", "")) or None
    nodes = [int(n) for n in env.get("TOPOD_MEMORY_NODES", "").split(",") if n]
    if not cpus:
        # Memory bound to a node while the threads roam every socket is the worst of both.
        print(f"topoctl run: WARNING: lease {lease['id']} pins no CPUs (cpus_per_gpu 0): the command runs "
              "unpinned and its memory is not bound either", file=sys.stderr)
        nodes = []

    from topod.pinning import pin_to

    def pin() -> None:
        if cpus:
            try:
                _, warning = pin_to(cpus)
            except OSError as exc:  # the lease names CPUs this kernel does not have online
                os.write(2, f"topoctl run: WARNING: CPUs not pinned ({exc}); memory not bound either\n".encode())
                return
            if warning:
                os.write(2, f"topoctl run: WARNING: {warning}\n".encode())
        if nodes:
            try:
                bind_memory(nodes)
            except OSError as exc:
                os.write(2, f"topoctl run: WARNING: memory not bound: {exc}\n".encode())

    # The child waits on `go` until it is in the lease's scope: nothing of the command runs
    # outside it. Pinning follows the move (a cpuset move resets affinity on older kernels).
    sys.stdout.flush()
    sys.stderr.flush()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_write)
        _child(go_read, command, env, pin, journal)
    os.close(go_read)
    outcome: dict | None = None
    code: int | None = None
    try:
        outcome = _enclose(client, lease, pid, cpus, nodes)
        if outcome["enforcement"] != "cgroup":
            print(f"topoctl run: lease {lease['id']} enforcement {outcome['enforcement']}: {outcome['reason']}",
                  file=sys.stderr, flush=True)
        if getattr(args, "json", False):
            print(json.dumps(outcome), flush=True)
        os.write(go_write, b"g")
        os.close(go_write)
        go_write = -1
        code = _wait(pid)
    finally:
        if go_write >= 0:  # never told to go: it exits 125 at EOF, unrun
            os.close(go_write)
            if code is None:
                _wait(pid)
        if outcome is not None and outcome["scope"]["created"] and outcome["scope"].get("by") != "topod":
            from topod.scope import ScopeError, stop_scope

            try:  # what the command left running in the scope ends with the lease
                stop_scope(outcome["scope"]["unit"])
            except ScopeError as exc:
                print(f"topoctl run: could not stop {outcome['scope']['unit']}: {exc}", file=sys.stderr)
        try:
            client.release(lease["id"])
        except Exception:  # noqa: BLE001 - owner_pid reclaims it when we exit anyway
            pass
    return code if code >= 0 else 128 - code
