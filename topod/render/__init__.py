"""Pictures of the host: a graph model (graph.py) and its Graphviz form (dot.py)."""

from __future__ import annotations

from topod.render.dot import RenderError, render, to_dot
from topod.render.graph import HostGraph, build_graph

__all__ = ["HostGraph", "RenderError", "build_graph", "render", "to_dot"]
