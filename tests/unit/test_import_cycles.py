"""The layout has one way through it: no import cycle among topod's modules, no arrow
running back up from the pure core (config, model, distance, alloc/, irq/) into the daemon
(topod.service), the API (topod.api) or the CLI (topod.cli), and no class spread over
several files as mixins (a class with two or more of topod's own classes as bases).

Imports anywhere in a module count (inside functions and `if TYPE_CHECKING:` blocks too):
a lazy import is still a dependency, and a type-only one still ties two files together.
The graph is read from the source with ast, so the test needs nothing outside the repository.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "topod"
# The core, and the layers it must never import (directly or through another module).
CORE = ("topod.config", "topod.model", "topod.distance", "topod.alloc", "topod.irq")
ABOVE_CORE = ("topod.service", "topod.api", "topod.cli")


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> its file (a package by its __init__.py)."""
    out = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `name` imports, relative imports resolved; `from a import b`
    counts as a.b when b is a module, else as a. A package's own parents are left out
    (importing a.b.c runs a/__init__ and a/b/__init__: no edge worth a cycle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = module_files(package)
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module `start` imports, directly or not -> the module that imports it (a path back)."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        node = todo.pop()
        for target in graph.get(node, ()):
            if target not in via and target != start:
                via[target] = node
                todo.append(target)
    return via


def chain(via: dict[str, str], start: str, end: str) -> str:
    path = [end]
    while path[-1] != start:
        path.append(via[path[-1]])
    return " -> ".join(reversed(path))


def test_topod_has_no_import_cycle():
    found = cycles(import_graph())
    assert found == [], "import cycles (merge the two files, or give the shared piece its own module): " + "; ".join(
        " <-> ".join(cycle) for cycle in found)


def test_core_modules_never_import_the_daemon_the_api_or_the_cli():
    graph = import_graph()
    core = sorted(name for name in graph if within(name, CORE))
    assert "topod.config" in core and "topod.alloc.engine" in core and "topod.irq.planner" in core
    upward = []
    for name in core:
        via = reachable(graph, name)
        upward += [chain(via, name, target) for target in sorted(via) if within(target, ABOVE_CORE)]
    assert upward == [], "the core reaches up into service/api/cli: " + "; ".join(upward)


@pytest.mark.parametrize("source, expected", [
    ({"a": "import p.b\n", "b": "from p import a\n"}, [["p.a", "p.b"]]),
    ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import X\n",
      "b": "def f():\n    from .a import Y\n"}, [["p.a", "p.b"]]),
    ({"a": "import p.b\n", "b": "import p.c\n", "c": "import os\n"}, []),
])
def test_the_cycle_check_sees_lazy_and_type_only_imports(tmp_path, source, expected):
    package = tmp_path / "p"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in source.items():
        (package / f"{name}.py").write_text(text)
    assert cycles(import_graph(package)) == expected


def test_the_layering_check_names_the_chain_that_runs_back_up():
    graph = {"topod.config": {"topod.alloc.x"}, "topod.alloc.x": {"topod.service.store"}, "topod.service.store": set()}
    via = reachable(graph, "topod.config")
    assert chain(via, "topod.config", "topod.service.store") == "topod.config -> topod.alloc.x -> topod.service.store"


def topod_bases(path: Path) -> dict[str, list[str]]:
    """Class name -> its bases that are topod's own classes (defined in the module, or
    imported from a topod module)."""
    tree = ast.parse(path.read_text(), str(path))
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    imported = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "topod")
                for alias in node.names}
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = [base.id for base in node.bases if isinstance(base, ast.Name)]
            out[node.name] = [name for name in names if name in own or name in imported]
    return out


def test_no_class_is_spread_over_files_as_mixins():
    mixed = []
    for name, path in sorted(module_files(PACKAGE).items()):
        for cls, bases in topod_bases(path).items():
            if len(bases) > 1:
                mixed.append(f"{name}.{cls}({', '.join(bases)})")
    assert mixed == [], "compose objects instead of mixing classes in: " + "; ".join(mixed)


def test_the_mixin_check_sees_two_of_topods_classes_as_bases(tmp_path):
    path = tmp_path / "service.py"
    path.write_text("from topod.service.a import A\nfrom .b import B\nimport enum\n"
                    "class S(A, B): ...\nclass E(A, enum.Enum): ...\nclass K(Exception): ...\n")
    assert topod_bases(path) == {"S": ["A", "B"], "E": ["A"], "K": []}
