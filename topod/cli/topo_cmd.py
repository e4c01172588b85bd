"""`topoctl topo` and `topoctl snapshot`: the host as topod sees it.

With a daemon serving the same root, `topo --json` is the daemon's own answer
(GET /v1/topology: no discovery here, plus `cluster` and `leased_gpus`), the text view
marks leased GPUs, and pictures colour the leases. Arguments: topod.cli.commands.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from topod.jsonindent import dumps_indented


def load_topology(root: str):
    from topod.discover import discover
    from topod.host import HostRoot

    return discover(HostRoot(root))


def run_topo(args: argparse.Namespace) -> int:
    from topod.cli.daemon_view import find

    fmt = args.format or ("json" if args.json else "text")
    if args.matrix and fmt != "text":
        from topod.cli.exits import UsageError

        raise UsageError(f"--matrix prints the text matrix; it cannot go with {'--json' if fmt == 'json' else '--format ' + fmt}")
    view = find(args)
    if fmt == "json":
        view.announce(args.json)
        document = None
        if view.serves_root:
            from topod.client import ApiError

            try:
                document = view.client.topology()
            except ApiError as exc:
                sys.stderr.write(f"topoctl: topod at {view.socket} gave no topology ({exc}); discovering here\n")
        if document is None:
            from topod.topojson import topology_to_json

            document = topology_to_json(load_topology(view.root))
        sys.stdout.write(dumps_indented(document) + "\n")  # one write, not one per token
        return 0
    topology = load_topology(view.root)
    if args.matrix:
        from topod.cli.topo_text import render_matrix

        view.announce(args.json)
        matrix = render_matrix(topology)
        if not matrix:
            sys.stderr.write(f"topoctl: no device matrix: {view.root} has no GPU and fewer than two RDMA NICs\n")
        sys.stdout.write(matrix)
        return 0
    if fmt == "text":
        from topod.cli.topo_text import render_topology

        if not view.serves_root:
            view.announce(args.json)
        leases = view.leases() if view.serves_root else None
        header = f"daemon: topod at {view.socket}: {view.lease_summary()}" if view.serves_root else None
        sys.stdout.write(render_topology(topology, leases=leases, daemon_line=header))
        return 0
    view.announce(args.json)
    from topod.cli.draw_cmd import draw

    leases = irq_plan = irq_now = None
    if view.serves_root:
        from topod.cli.doctor_cmd import daemon_data

        leases, _, _ = daemon_data(view)
        irq_plan, irq_now = _irq_placements(view)
    return int(draw(topology, fmt, args.output, leases=leases, irq_plan=irq_plan, irq_current=irq_now) or 0)


def _irq_placements(view) -> tuple[dict | None, dict | None]:  # noqa: ANN001 - DaemonView
    """(where the daemon's IRQ plan puts each vector, where each is delivered now:
    effective affinity, else smp_affinity) from GET /v1/irqs; in dry-run they differ."""
    from topod.client import ApiError

    try:
        report = view.client.request("GET", "/v1/irqs")
    except ApiError:
        return None, None
    entries = [e for e in report.get("irqs", []) if isinstance(e, dict) and "irq" in e]
    planned = {str(e["irq"]): e["planned"] for e in entries if e.get("planned")}
    now = {str(e["irq"]): e.get("effective") or e.get("current") for e in entries
           if e.get("effective") or e.get("current")}
    return planned or None, now or None


def run_snapshot(args: argparse.Namespace) -> int:
    """Capture --root, else the root the daemon on --socket serves (GET /v1/health
    "root"), else /; the root taken is said on stderr, as by every host-side command."""
    from topod.cli.daemon_view import find
    from topod.host import HostRoot
    from topod.snapshot import write_snapshot

    view = find(args)
    view.announce(args.json)
    host = HostRoot(view.root)
    name = os.path.basename(args.output)
    for suffix in (".tar.gz", ".tgz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    count = write_snapshot(host, args.output, name or "snapshot")
    if args.json:
        sys.stdout.write(json.dumps({"root": str(host.root), "output": args.output, "entries": count,
                                     "top": name}) + "\n")
    else:
        sys.stdout.write(f"wrote {args.output} from root {host.root}: {count} entries under {name}/ "
                         f"(extract with: tar xzf {args.output}; then topoctl topo --root {name})\n")
    return 0
