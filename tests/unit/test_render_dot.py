"""Graphviz output: DOT text from the model, pictures through `dot`, clear errors without it."""

import shutil

import pytest

from topod.cli.draw_cmd import draw
from topod.render import RenderError, build_graph, render, to_dot

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz 'dot' not installed")


@pytest.fixture(scope="module")
def h800(tmp_path_factory):
    from topod.discover import discover
    from topod.host import HostRoot
    from topod.hostspec import build_host, load_builtin_spec

    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path_factory.mktemp("dot") / "h800-8gpu")
    return discover(HostRoot(root))


def test_dot_has_one_cluster_per_numa_node_and_quotes_labels(h800):
    text = to_dot(build_graph(h800))
    assert text.startswith("digraph host {") and text.rstrip().endswith("}")
    assert text.count("subgraph cluster_numa") == 2
    assert '"pci:0000:13:00.0" [label="GPU0 H800\\n0000:13:00.0"' in text
    assert "rankdir=LR" in text


def test_dot_draws_a_legend_only_with_leases(h800):
    assert "cluster_legend" not in to_dot(build_graph(h800))
    leased = to_dot(build_graph(h800, [{"id": "L1", "owner": "alice", "gpus": [0], "cpus": []}]))
    assert "cluster_legend" in leased and '"owner:alice"' in leased


def test_missing_dot_binary_says_what_to_install():
    with pytest.raises(RenderError, match="apt-get install graphviz"):
        render("digraph {}", "svg", dot_binary="no-such-dot-binary")


def test_unknown_format_is_refused():
    with pytest.raises(RenderError, match="unknown picture format 'gif'"):
        render("digraph {}", "gif")


@needs_dot
def test_graphviz_errors_are_reported():
    with pytest.raises(RenderError, match="Graphviz failed"):
        render("digraph { this is not dot", "svg")


@needs_dot
def test_draw_writes_svg_and_png_files(h800, tmp_path):
    svg, png = tmp_path / "host.svg", tmp_path / "host.png"
    assert draw(h800, "svg", str(svg)) == 0
    assert "<svg" in svg.read_text() and "GPU7" in svg.read_text()
    assert draw(h800, "png", str(png), leases=[{"id": "L1", "owner": "alice", "gpus": [0]}]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draw_dot_to_stdout(h800, capsysbinary):
    assert draw(h800, "dot", None) == 0
    assert capsysbinary.readouterr().out.startswith(b"digraph host {")
