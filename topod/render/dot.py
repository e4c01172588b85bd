"""Graphviz DOT from a HostGraph, and SVG/PNG through Debian's `dot` binary."""

from __future__ import annotations

import shutil
import subprocess

from topod.errors import TopodError
from topod.render.graph import HostGraph

FORMATS = ("dot", "svg", "png")
RENDER_TIMEOUT_S = 60

STYLE = {  # kind -> (shape, fill)
    "numa": ("box", "#bbdefb"),
    "cores": ("box", "#eceff1"),
    "root_complex": ("box", "#cfd8dc"),
    "switch": ("box", "#b0bec5"),
    "gpu": ("box", "#a5d6a7"),
    "nvswitch": ("box", "#dcedc8"),
    "rdma": ("box", "#ffe0b2"),
    "nic": ("box", "#fff9c4"),
    "nvme": ("box", "#e1bee7"),
    "storage": ("box", "#e1bee7"),
    "other": ("box", "#f5f5f5"),
    "fabric": ("box", "#66bb6a"),
}
EDGE_STYLE = {  # kind -> attributes
    "numa": 'color="#90a4ae"',
    "pci": 'color="#455a64"',
    "nvlink": 'color="#2e7d32", penwidth=2, constraint=false, fontcolor="#2e7d32"',
    "nvswitch": 'color="#43a047", penwidth=1.5, style=dashed, fontcolor="#2e7d32"',
}


class RenderError(TopodError):
    """Graphviz is missing or failed; the message says what to install or use instead."""

    code = "render_failed"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: HostGraph, rankdir: str = "LR") -> str:
    out = ["digraph host {",
           f"  graph [rankdir={rankdir}, label={_quote(graph.title)}, labelloc=t, fontname=\"Helvetica\", "
           "fontsize=20, nodesep=0.15, ranksep=0.5, newrank=true, ordering=out];",
           '  node [fontname="Helvetica", fontsize=11, style="filled,rounded", margin="0.12,0.05"];',
           '  edge [fontname="Helvetica", fontsize=9, arrowhead=none];']
    by_cluster: dict[str | None, list[str]] = {}
    for node in graph.nodes:
        by_cluster.setdefault(node.cluster, []).append(_node_line(graph, node))
    for cluster in graph.clusters:
        out.append(f"  subgraph cluster_{cluster.id} {{")
        out.append(f'    label={_quote(cluster.label)}; style="rounded"; color="#1e88e5"; penwidth=2; '
                   f'fontsize=16; fontname="Helvetica-Bold";')
        out.extend("    " + line for line in by_cluster.get(cluster.id, []))
        out.append("  }")
    out.extend("  " + line for line in by_cluster.get(None, []))
    # Graphviz stacks the out-edges of a rank bottom-up when it rotates to LR; feeding them
    # reversed keeps the host's order (GPU0 on top) in the picture.
    for edge in reversed(graph.edges) if rankdir == "LR" else graph.edges:
        if edge.kind in ("nvswitch_chip", "irq"):
            continue  # said in labels (chip count, IRQ CPUs): lines across the host only tangle it
        attrs = [EDGE_STYLE.get(edge.kind, "")]
        if edge.label:
            attrs.append(f"label={_quote(edge.label)}")
        if edge.degraded:
            attrs.append('color="#c62828", penwidth=2.5, fontcolor="#c62828"')
        out.append(f"  {_quote(edge.tail)} -> {_quote(edge.head)} [{', '.join(a for a in attrs if a)}];")
    if graph.owner_colours:
        out.append("  subgraph cluster_legend {")
        out.append('    label="leases by owner"; style="rounded"; color="#9e9e9e";')
        for owner, colour in graph.owner_colours:
            out.append(f"    {_quote('owner:' + owner)} [label={_quote(owner)}, shape=box, fillcolor=\"{colour}\"];")
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def _node_line(graph: HostGraph, node) -> str:
    shape, fill = STYLE.get(node.kind, ("box", "#ffffff"))
    if node.owner:
        fill = graph.colour_of(node.owner) or fill
    elif node.kind == "gpu" and graph.owner_colours:
        fill = "#ffffff"  # an unleased GPU on a host with leases: free
    attrs = [f"label={_quote(node.label)}", f"shape={shape}", f'fillcolor="{fill}"']
    if node.kind == "fabric":
        attrs.append('fontcolor="white", fontsize=13')
    if node.kind in ("gpu", "numa"):
        attrs.append("penwidth=1.5")
    if node.owner:
        attrs.append("penwidth=3")
    if node.degraded:
        attrs.append('color="#c62828", penwidth=2.5')
    return f"{_quote(node.id)} [{', '.join(attrs)}];"


def render(dot_text: str, fmt: str, dot_binary: str = "dot") -> bytes:
    """DOT text -> SVG or PNG bytes by running Graphviz."""
    if fmt == "dot":
        return dot_text.encode()
    if fmt not in FORMATS:
        raise RenderError(f"unknown picture format {fmt!r}; use one of {', '.join(FORMATS)}")
    binary = shutil.which(dot_binary)
    if binary is None:
        raise RenderError(f"Graphviz '{dot_binary}' is not on PATH: install it (apt-get install graphviz) "
                          f"or write DOT with --format dot and render it elsewhere")
    try:
        done = subprocess.run([binary, f"-T{fmt}"], input=dot_text.encode(), capture_output=True,
                              timeout=RENDER_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RenderError(f"Graphviz took over {RENDER_TIMEOUT_S} s to lay out the host; try --format dot") from exc
    if done.returncode != 0:
        raise RenderError(f"Graphviz failed (exit {done.returncode}): {done.stderr.decode(errors='replace').strip()}")
    return done.stdout
