"""Pictures for `topoctl topo --format dot|svg|png [--output FILE]`."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

from topod.model import Topology


def draw(topology: Topology, fmt: str, output: str | None, leases: Iterable[object] | None = None,
         irq_plan: Mapping[object, Iterable[int]] | None = None,
         irq_current: Mapping[object, Iterable[int]] | None = None) -> int:
    """Draw the host (leases coloured by owner, where IRQs are now as edges, the plan
    where it differs) to output or stdout."""
    from topod.render import RenderError, build_graph, render, to_dot

    data = render(to_dot(build_graph(topology, leases, irq_plan, irq_current)), fmt)
    if output and output != "-":
        from topod.outfile import replaced_whole

        with replaced_whole(output) as handle:  # no half picture on failure
            handle.write(data)
        print(f"wrote {output} ({fmt}, {len(data)} bytes)", file=sys.stderr)
        return 0
    if fmt == "png" and sys.stdout.isatty():
        raise RenderError("PNG is binary: give --output FILE (or pipe it)")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0
