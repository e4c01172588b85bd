"""`topoctl example-host NAME DIR`: write one of topod's built-in host trees (the specs in
topod/hostspec/hosts/) into DIR, so topod and every host-side command can be tried
without the hardware: `topoctl topo --root DIR`, `topod --root DIR`.

DIR must be new or empty: the tree is written file by file under it, and a directory
already in use (a home, a captured tree, /) is never written into. `--demo-job` adds an
8-rank training job's processes under DIR/proc (one rank on the far socket) for
`topoctl doctor --root DIR`. Arguments: topod.cli.commands.
"""

from __future__ import annotations

import json
import os
import sys

from topod.cli.exits import UsageError


def _names() -> list[str]:
    from topod.hostspec import builtin_spec_names

    return builtin_spec_names()


def _check_target(directory: str) -> None:
    """DIR new or an empty directory; anything else is a usage error that names it."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise UsageError(f"{directory}: exists and is not a directory; name a new or empty directory") from None
    except OSError as exc:
        raise UsageError(f"{directory}: {exc.strerror or exc}") from None
    if entries:
        raise UsageError(f"{directory}: not empty ({len(entries)} entries); example-host writes only into a new "
                         "or empty directory")


def run_example_host(args) -> int:  # noqa: ANN001 - Namespace
    names = _names()
    if args.list:
        if args.name or args.directory:
            raise UsageError("--list takes no NAME or DIR")
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    if not args.name or not args.directory:
        raise UsageError("give NAME and DIR (topoctl example-host h800-8gpu /tmp/h800), or --list")
    if args.name not in names:
        raise UsageError(f"no built-in host {args.name!r}; built-in hosts: {', '.join(names)}")
    _check_target(args.directory)
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host, load_builtin_spec

    build_host(load_builtin_spec(args.name), args.directory)
    topology = discover(HostRoot(args.directory), live_nvml=False)
    ranks = _write_demo_job(args.directory, topology) if args.demo_job else 0
    summary = {"name": args.name, "root": os.path.abspath(args.directory), "numa_nodes": len(topology.numa_nodes),
               "cpus": len(topology.online_cpus), "gpus": len(topology.gpus), "demo_job_ranks": ranks}
    if args.json:
        print(json.dumps(summary))
        return 0
    job = f", an {ranks}-rank job (rank 3 on the far socket)" if ranks else ""
    print(f"wrote {args.name} to {summary['root']}: {summary['numa_nodes']} NUMA node(s), {summary['cpus']} CPUs, "
          f"{summary['gpus']} GPU(s){job}")
    print(f"try: topoctl topo --root {args.directory}", file=sys.stderr)
    return 0


def _write_demo_job(directory: str, topology) -> int:  # noqa: ANN001 - topod.model.Topology
    from topod.hostspec.doctor_scene import demo_job, write_process

    if len(topology.gpus) < 4 or len(topology.numa_nodes) < 2:
        raise UsageError("--demo-job needs a host with at least 4 GPUs on 2 NUMA nodes (h800-8gpu, pcie-8gpu)")
    specs = demo_job(topology)
    for spec in specs:
        write_process(directory, spec)
    return len(specs)
