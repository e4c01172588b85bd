#!/usr/bin/env python3
"""The reference sections of docs/, generated from the code they describe.

    python3 scripts/docs_reference.py           # rewrite the generated sections in place
    python3 scripts/docs_reference.py --check   # exit 1 naming each page that is stale

Each section sits between `<!-- BEGIN generated: NAME ... -->` and
`<!-- END generated: NAME -->` in its page; the prose around it is written by hand.
- config (docs/operations.md): every key of `topod.config.SCHEMA` with its type, default,
  allowed values and whether a reload applies it; each key's meaning is the comment beside
  it in etc/topod.toml, the documented default configuration.
- api (docs/api.md): every operation of the OpenAPI document (`topod.api.openapi`), the
  allocation request's fields and the error codes.
- topoctl (docs/topoctl.md): every command and option of topoctl's parser.
tests/unit/test_docs.py fails when a section differs from what this script writes.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


# -- config -------------------------------------------------------------------------

TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "table", list: "array",
              "cpulist": "CPU list", "cpus_per_gpu": "\"auto\" or integer"}


def type_name(kind: object) -> str:
    return TYPE_NAMES.get(kind, getattr(kind, "__name__", str(kind)))  # type: ignore[call-overload]


def default_text(value: object) -> str:
    """A default as it is written in TOML."""
    from topod.cli.manpages import _toml_value

    return _toml_value(value)


def _allowed(section: str, key: str, kind: object) -> str:
    from topod.config import CHOICES, FLOAT_RANGE, INT_MINIMUM, POSITIVE

    if (section, key) in CHOICES:
        return ", ".join(f"`{choice}`" for choice in CHOICES[section, key])
    if (section, key) in FLOAT_RANGE:
        low, high, low_included = FLOAT_RANGE[section, key]
        return f"{'[' if low_included else '('}{low:g}, {high:g}]"
    if (section, key) in POSITIVE:
        return "> 0"
    if (section, key) in INT_MINIMUM:
        return f">= {INT_MINIMUM[section, key]}"
    if kind in (int, float):
        return ">= 0"
    return ""


def config_reference() -> str:
    from topod.cli.manpages import toml_comments
    from topod.config import RESTART_KEYS, SCHEMA

    comments = toml_comments((REPO / "etc" / "topod.toml").read_text())
    lines: list[str] = []
    for section, keys in SCHEMA.items():
        lines += [f"#### [{section}]", ""]
        if not keys:
            lines += ["Free-form `KEY = \"value\"` labels (`rack`, `leaf`, ...): exported to Kubernetes "
                      "NodeResourceTopology attributes, `GET /v1/topology` and Slurm `topology.conf` trees.", ""]
            continue
        lines += ["| key | type | default | allowed | applies | meaning |", "|---|---|---|---|---|---|"]
        for key, (kind, default) in keys.items():
            meaning = comments.get((section, key), ("", ""))[1]
            applies = "restart" if (section, key) in RESTART_KEYS else "reload"
            lines.append(f"| `{key}` | {type_name(kind)} | `{_cell(default_text(default))}` | "
                         f"{_allowed(section, key, kind)} | {applies} | {_cell(meaning)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# -- api ----------------------------------------------------------------------------

METHODS = ("get", "post", "put", "patch", "delete")


def _schema_type(schema: dict) -> str:
    if "oneOf" in schema:
        return " or ".join(_schema_type(option) for option in schema["oneOf"])
    if "const" in schema:
        return f"`\"{schema['const']}\"`"
    kind = schema.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    text = " or ".join(str(k) for k in kinds)
    if "enum" in schema:
        text += " (" + ", ".join(f"`{value}`" for value in schema["enum"]) + ")"
    return text


def _bounds(schema: dict) -> str:
    parts = []
    for option in schema.get("oneOf", [schema]):
        if "minimum" in option:
            parts.append(f">= {option['minimum']:g}")
        if "exclusiveMinimum" in option:
            parts.append(f"> {option['exclusiveMinimum']:g}")
        if "maximum" in option:
            parts.append(f"<= {option['maximum']:g}")
        if "maxLength" in option:
            parts.append(f"at most {option['maxLength']} characters")
        if "maxItems" in option:
            parts.append(f"at most {option['maxItems']} items")
    return ", ".join(dict.fromkeys(parts))


def api_reference() -> str:
    from topod.api.openapi import openapi_document

    document = openapi_document()
    lines = ["| method | path | what | answers |", "|---|---|---|---|"]
    for path, item in document["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            operation = item[method]
            statuses = ", ".join(sorted(operation.get("responses", {})))
            lines.append(f"| `{method.upper()}` | `{path}` | {_cell(operation.get('summary', ''))} | {statuses} |")
    request = document["components"]["schemas"]["LeaseRequest"]
    required = set(request.get("required", []))
    lines += ["", "#### Allocation request (`POST /v1/leases`)", "",
              "| field | type | bounds | meaning |", "|---|---|---|---|"]
    for name, schema in request["properties"].items():
        shown = f"`{name}`" + (" (required)" if name in required else "")
        lines.append(f"| {shown} | {_schema_type(schema)} | {_bounds(schema)} | {_cell(schema.get('description', ''))} |")
    error = document["components"]["schemas"]["Error"]
    lines += ["", "#### Errors", "", _cell(error.get("description", "")), "",
              "| field | meaning |", "|---|---|"]
    for name, schema in error["properties"].items():
        lines.append(f"| `{name}` | {_cell(schema.get('description', '') or schema.get('type', ''))} |")
    return "\n".join(lines) + "\n"


# -- topoctl ------------------------------------------------------------------------

def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        if "-h" in action.option_strings:
            continue
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                metavar = action.metavar or (action.dest.upper() if not action.choices else
                                             "{" + ",".join(map(str, action.choices)) + "}")
            shown = ", ".join(f"`{flag}{' ' + metavar if metavar else ''}`" for flag in action.option_strings)
        else:
            shown = f"`{action.metavar or action.dest}`"
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        rows.append(f"| {shown} | {_cell(help_text)} |")
    return rows


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().split()[1:])


def topoctl_reference() -> str:
    from topod.cli.commands import EXIT_STATUS, build_parser
    from topod.cli.manpages import _subparsers

    parser = build_parser()
    lines = ["#### Exit status", "", "| status | meaning |", "|---|---|"]
    lines += [f"| {code} | {_cell(text)} |" for code, text in EXIT_STATUS]
    lines += ["", "#### Global options", "", "Accepted before or after the command.", "",
              "| option | meaning |", "|---|---|", *_option_rows(parser)]

    def walk(sub: argparse.ArgumentParser, words: list[str], help_text: str) -> None:
        lines.extend(["", f"#### {' '.join(words)}", "", _cell(help_text), "", "```text", _usage(sub), "```"])
        rows = _option_rows(sub)
        if rows:
            lines.extend(["", "| option | meaning |", "|---|---|", *rows])
        for name, text, child in _subparsers(sub):
            walk(child, words + [name], text)

    for name, text, sub in _subparsers(parser):
        walk(sub, ["topoctl", name], text)
    return "\n".join(lines) + "\n"


# -- pages --------------------------------------------------------------------------

SECTIONS = {"config": ("docs/operations.md", config_reference),
            "api": ("docs/api.md", api_reference),
            "topoctl": ("docs/topoctl.md", topoctl_reference)}


def _markers(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- BEGIN generated: {name}\b[^>]*-->\n)(.*?)(<!-- END generated: {name} -->)", re.S)


def generated_section(page_text: str, name: str) -> str | None:
    """The text between a page's markers for `name`, or None when the page has none."""
    found = _markers(name).search(page_text)
    return found.group(2) if found else None


def with_section(page_text: str, name: str, body: str) -> str:
    pattern = _markers(name)
    if not pattern.search(page_text):
        raise ValueError(f"no '<!-- BEGIN generated: {name} -->' ... '<!-- END generated: {name} -->' markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(3), page_text, count=1)


def stale_pages() -> list[str]:
    """'PAGE (section NAME)' for each generated section that differs from the code."""
    stale = []
    for name, (page, build) in SECTIONS.items():
        text = (REPO / page).read_text()
        if generated_section(text, name) != build():
            stale.append(f"{page} (section {name})")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated section is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for entry in stale:
            print(f"stale: {entry}; run python3 scripts/docs_reference.py", file=sys.stderr)
        return 1 if stale else 0
    for name, (page, build) in SECTIONS.items():
        path = REPO / page
        text = path.read_text()
        updated = with_section(text, name, build())
        if updated != text:
            path.write_text(updated)
            print(f"updated {page} (section {name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
