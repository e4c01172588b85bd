"""Man pages generated from the parsers and the configuration schema.

    python -m topod.cli.manpages OUTDIR     # writes topoctl.1, topod.8, topod.toml.5

topoctl(1) comes from topoctl's parser (every command and option), topod(8) from
`topod.service.main.build_parser()`, topod.toml(5) from `topod.config.SCHEMA` with the
comments of etc/topod.toml (when the source tree is at hand) as each key's description.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from topod import __version__

ETC_TOML = Path(__file__).resolve().parents[2] / "etc" / "topod.toml"
DATE = "2025"


def roff(text: object) -> str:
    """Escape text for roff: backslashes, leading dots and quotes, hyphens in options."""
    value = str(text).replace("\\", "\\e").replace("-", "\\-")
    lines = []
    for line in value.split("\n"):
        if line.startswith((".", "'")):
            line = "\\&" + line
        lines.append(line)
    return "\n".join(lines)


def _header(name: str, section: int, title: str) -> list[str]:
    return [f'.TH {name.upper()} {section} "{DATE}" "topod {__version__}" "{title}"']


def _option_lines(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                metavar = action.metavar or (action.dest.upper() if not action.choices else
                                             "{" + ",".join(map(str, action.choices)) + "}")
            flags = ", ".join(f"\\fB{roff(flag)}\\fR" + (f" \\fI{roff(metavar)}\\fR" if metavar else "")
                              for flag in action.option_strings)
        else:
            flags = f"\\fI{roff(action.metavar or action.dest)}\\fR"
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        if action.choices and action.option_strings and "{" not in help_text:
            help_text += f" (one of: {', '.join(map(str, action.choices))})"
        out += [".TP", flags, roff(help_text)]
    return out


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().split()[1:])


def topoctl_page() -> str:
    from topod.cli.commands import EXIT_STATUS, build_parser

    parser = build_parser()
    lines = _header("topoctl", 1, "topod manual")
    lines += [".SH NAME", "topoctl \\- " + roff("topod's command-line client: host topology views and GPU leases"),
              ".SH SYNOPSIS", f".B topoctl\n{roff('[--socket PATH] [--json] [--root DIR] COMMAND [OPTIONS]')}",
              ".SH DESCRIPTION", roff(parser.description or ""),
              ".PP", roff("Host-side commands (topo, snapshot, irq, links, export, doctor) read a host root. "
                          "When the daemon found through --socket, $TOPOD_SOCKET or the default socket "
                          "serves the same root (without --root, its root is adopted), they use its leases; "
                          "otherwise they say so in one line on standard error and go on alone. "
                          "Every host-side command names the root it read."),
              ".SH GLOBAL OPTIONS", roff("Accepted before or after the command."), *_option_lines(parser),
              ".SH COMMANDS"]

    def walk(sub: argparse.ArgumentParser, words: list[str], help_text: str) -> None:
        nested = _subparsers(sub)
        lines.extend([".SS " + roff(" ".join(words)), roff(help_text), ".PP",
                      ".B " + roff(_usage(sub)), *_option_lines(sub)])
        for name, text, child in nested:
            walk(child, words + [name], text)

    for name, text, sub in _subparsers(parser):
        walk(sub, ["topoctl", name], text)
    lines.append(".SH EXIT STATUS")
    for code, text in EXIT_STATUS:
        lines += [".TP", f"\\fB{code}\\fR", roff(text)]
    lines += [".SH ENVIRONMENT", ".TP", ".B TOPOD_SOCKET",
              roff("the daemon's socket when --socket is not given (default /run/topod/topod.sock)"),
              ".SH SEE ALSO", "\\fBtopod\\fR(8), \\fBtopod.toml\\fR(5), \\fBnvidia\\-smi\\fR(1), \\fBlstopo\\fR(1)"]
    return "\n".join(lines) + "\n"


def topod_page() -> str:
    from topod.service.main import EXIT_STATUS, build_parser

    parser = build_parser()
    lines = _header("topod", 8, "System Manager's Manual")
    lines += [".SH NAME", "topod \\- " + roff(parser.description or "topology daemon for GPU servers"),
              ".SH SYNOPSIS", ".B " + roff(_usage(parser)),
              ".SH DESCRIPTION",
              roff("topod discovers the host (NUMA nodes, CPUs, the PCIe tree, GPUs, NVLink and NVSwitch, "
                   "RDMA NICs, NVMe), keeps the IRQs of RDMA and NVMe devices on free CPUs near their device, "
                   "and leases GPU sets with their near CPUs and memory nodes over HTTP/JSON on a Unix socket. "
                   "It runs in the foreground (systemd Type=notify); SIGHUP reloads the configuration and "
                   "rediscovers, SIGTERM stops it. Options are never abbreviated."),
              ".SH OPTIONS", *_option_lines(parser),
              ".SH EXIT STATUS", *[line for code, text in EXIT_STATUS for line in (".TP", f"\\fB{code}\\fR", roff(text))],
              ".SH FILES", ".TP", ".I /etc/topod/topod.toml", roff("the configuration, see topod.toml(5)"),
              ".TP", ".I /run/topod/topod.sock", roff("the API socket (mode 0660, group topod)"),
              ".TP", ".I /var/lib/topod", roff("the lease database (SQLite)"),
              ".SH SEE ALSO", "\\fBtopoctl\\fR(1), \\fBtopod.toml\\fR(5), \\fBsystemd.service\\fR(5)"]
    return "\n".join(lines) + "\n"


def toml_comments(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(section, key): (value as written, comment)} from a documented topod.toml."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        header = re.match(r"^\[([A-Za-z0-9_.]+)\]\s*(?:#\s*(.*))?$", line)
        if header:
            section = header.group(1)
            if "." in section and header.group(2):
                parent, key = section.split(".", 1)
                found[(parent, key)] = ("", header.group(2).strip())
            continue
        match = re.match(r"^([A-Za-z0-9_]+)\s*=\s*(.+?)(?:\s+#\s*(.*))?$", line)
        if match and section:
            found[(section, match.group(1))] = (match.group(2).strip(), (match.group(3) or "").strip())
    return found


def toml_page() -> str:
    from topod.config import SCHEMA

    comments = toml_comments(ETC_TOML.read_text()) if ETC_TOML.is_file() else {}
    lines = _header("topod.toml", 5, "File Formats Manual")
    lines += [".SH NAME", "topod.toml \\- " + roff("configuration of topod(8)"),
              ".SH SYNOPSIS", ".I /etc/topod/topod.toml",
              ".SH DESCRIPTION",
              roff("One TOML file. Unknown sections or keys and wrong types are rejected with the key's path; "
                   "numbers must be finite, periods greater than 0. Validate with topod --check-config FILE; "
                   "apply with systemctl reload topod (an invalid file keeps the running configuration).")]
    for section, keys in SCHEMA.items():
        lines.append(f".SH [{roff(section)}]")
        if not keys:
            lines.append(roff("free-form KEY = \"value\" labels (rack, leaf, ...): exported to Kubernetes "
                               "NodeResourceTopology attributes, GET /v1/topology and Slurm topology.conf trees"))
        for key, (kind, default) in keys.items():
            written, comment = comments.get((section, key), ("", ""))
            kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
            shown = written or _toml_value(default)
            lines += [".TP", f"\\fB{roff(key)}\\fR = {roff(shown)}",
                      roff(f"({kind_name}) {comment}".rstrip())]
    lines += [".SH SEE ALSO", "\\fBtopod\\fR(8), \\fBtopoctl\\fR(1)"]
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{}" if not value else "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


PAGES = {"topoctl.1": topoctl_page, "topod.8": topod_page, "topod.toml.5": toml_page}


def write_pages(outdir: str | Path) -> list[Path]:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, page in PAGES.items():
        path = out / name
        path.write_text(page(), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write("usage: python -m topod.cli.manpages OUTDIR\n")
        return 2
    for path in write_pages(argv[0]):
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
