"""topoctl: the command-line client (host views work without a daemon)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from topod import __version__
from topod.errors import TopodError

# Subcommand modules, each exposing register(subparsers). Imported only to build the
# parser; each keeps its heavy imports inside its handlers.
COMMAND_MODULES = (
    "topod.cli.topo_cmd",
    "topod.cli.lease_cmd",
    "topod.cli.irq_cmd",
    "topod.cli.links_cmd",
    "topod.cli.export_cmd",
    "topod.cli.doctor_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topoctl", description="topod's command-line client")
    parser.add_argument("--version", action="version", version=f"topoctl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(args) or 0)
    except TopodError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"code": exc.code, "message": str(exc)}), file=sys.stderr)
        else:
            print(f"topoctl: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `topoctl topo | head` closes the pipe early; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
