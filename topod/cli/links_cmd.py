"""`topoctl links`: expected vs measured, per link.

Without a daemon it probes here and now: discovers the host at --root, runs --rounds
probe cycles with the chosen backend, calibrates, and shows each link's expected level
(from the distance model) beside what was measured, with sample counts and ages, then
what calibration found. `render_links` renders a GET /v1/links document the same way.
"""

from __future__ import annotations

import argparse
import sys
import time

from topod.errors import ConfigError
from topod.jsonindent import dumps_indented


def run_links(args: argparse.Namespace) -> int:
    from topod.cli.daemon_view import find
    from topod.cli.topo_cmd import load_topology
    from topod.host import HostRoot
    from topod.probe.backend import ProbeUnavailable
    from topod.probe.registry import open_backend
    from topod.probe.calibrate import calibrate
    from topod.probe.linkstate import LinkState, links_document

    view = find(args)
    view.announce(args.json)
    if args.backend in ("host-memory", "cuda") and not HostRoot(view.root).is_live:
        raise ConfigError(f"--backend {args.backend} measures this machine, not the tree at --root {view.root}; "
                          "use --root / or --backend simulated:<file>")
    topology = load_topology(view.root)
    try:
        backend = open_backend(args.backend, topology)
    except ProbeUnavailable as exc:
        raise ConfigError(f"--backend {args.backend}: {exc}") from exc
    skipped: dict[str, str] = {}
    try:
        state = LinkState(backend.links())
        for _ in range(args.rounds):
            results = []
            for link in state.links:
                try:
                    results.append(backend.measure(link))
                except ProbeUnavailable as exc:
                    skipped[str(link)] = str(exc)
            state.fold_cycle(results)
    finally:
        backend.close()
    calibration = calibrate(topology, state.measurements())
    document = links_document(state, topology, time.time(), calibration.findings)
    document["backend"] = args.backend
    document["rounds"] = args.rounds
    document["skipped"] = [{"link": link, "reason": reason} for link, reason in sorted(skipped.items())]
    document["gpus"] = {gpu.address: gpu.index for gpu in topology.gpus}
    document["root"] = view.root
    if args.json:
        sys.stdout.write(dumps_indented(document) + "\n")
    else:
        sys.stdout.write(render_links(document))
    return 0


def render_links(document: dict) -> str:
    """Text table of a links document (GET /v1/links or `topoctl links --json`)."""
    names = {address: f"gpu{index}" for address, index in document.get("gpus", {}).items()}
    header = ("LINK", "EXPECTED", "GB/s", "HEALTHY", "LAT us", "SAMPLES", "AGE s", "STATE")
    rows = [header]
    for row in document.get("links", []):
        kind, src, dst = row["link"].split("/")
        rows.append((
            f"{kind} {names.get(src, src)} -> {names.get(dst, dst)}",
            str(row["expected"]),
            _number(row["measured_gbps"]),
            _number(row["healthy_gbps"]),
            _number(row["latency_us"]),
            f"{row['probe_samples']}+{row['telemetry_samples']}",
            _number(row["age_s"]),
            row["state"],
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("SAMPLES = probe+telemetry; GB/s = EWMA; HEALTHY = median of healthy samples")
    if document.get("backend"):
        root = f"root {document['root']}, " if document.get("root") else ""
        lines.insert(0, f"{root}backend {document['backend']}, {document.get('rounds', '?')} round(s)")
    for skip in document.get("skipped", []):
        lines.append(f"skipped {skip['link']}: {skip['reason']}")
    findings = document.get("findings", [])
    lines.append("" if findings else "findings: none")
    for finding in findings:
        lines.append(f"[{finding['code']}] {finding['subject']}: {finding['reason']}")
    for correction in document.get("corrections", []):
        a, b = correction["pair"]
        lines.append(f"weight x{correction['factor']} for {names.get(a, a)} <-> {names.get(b, b)}")
    return "\n".join(lines) + "\n"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"
