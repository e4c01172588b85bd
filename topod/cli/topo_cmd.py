"""`topoctl topo` and `topoctl snapshot`: the host as topod sees it."""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    topo = subparsers.add_parser("topo", help="show the host's topology")
    topo.add_argument("--root", default="/", help="host root (a captured tree); default /")
    topo.add_argument("--json", action="store_true", help="machine-readable output (schema in README)")
    topo.add_argument("--format", choices=("text", "json", "dot", "svg", "png"), default=None,
                      help="output format; dot/svg/png draw the host with Graphviz")
    topo.add_argument("--output", "-o", default=None, help="file for --format svg/png/dot (default stdout)")
    topo.add_argument("--socket", default=None, help="with a running daemon: colour its leases in pictures")
    topo.set_defaults(handler=run_topo)

    snapshot = subparsers.add_parser("snapshot", help="capture the host tree topod reads into a tar.gz")
    snapshot.add_argument("output", help="OUT.tar.gz")
    snapshot.add_argument("--root", default="/", help="host root to capture; default /")
    snapshot.set_defaults(handler=run_snapshot)


def load_topology(root: str):
    from topod.discover import discover
    from topod.host import HostRoot

    return discover(HostRoot(root))


def run_topo(args: argparse.Namespace) -> int:
    fmt = args.format or ("json" if args.json else "text")
    topology = load_topology(args.root)
    if fmt == "json":
        from topod.topojson import topology_to_json

        json.dump(topology_to_json(topology), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if fmt == "text":
        from topod.cli.topo_text import render_topology

        sys.stdout.write(render_topology(topology))
        return 0
    from topod.cli.draw_cmd import draw

    leases = irq_plan = None
    if args.socket:
        from topod.cli.doctor_cmd import fetch_daemon_data

        leases, irq_plan = fetch_daemon_data(args)
        if leases is None:
            print(f"topoctl: no daemon answered on {args.socket}; drawing without leases", file=sys.stderr)
    return int(draw(topology, fmt, args.output, leases=leases, irq_plan=irq_plan) or 0)


def run_snapshot(args: argparse.Namespace) -> int:
    from topod.host import HostRoot
    from topod.snapshot import write_snapshot

    host = HostRoot(args.root)
    name = os.path.basename(args.output)
    for suffix in (".tar.gz", ".tgz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    count = write_snapshot(host, args.output, name or "snapshot")
    print(f"wrote {args.output}: {count} entries under {name}/ "
          f"(extract with: tar xzf {args.output}; then topoctl topo --root {name})")
    return 0
