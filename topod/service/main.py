"""`topod`: the daemon's entry point (foreground; systemd runs it as Type=notify)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from topod import __version__
from topod.errors import ConfigError, TopodError

# sysexits' EX_CONFIG: the configuration (the file, or a state directory another daemon
# holds) is wrong, and starting again will not help. The unit does not restart on it
# (RestartPreventExitStatus=78); every other fatal error is 1 and is restarted.
EX_CONFIG = 78


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a mistyped --sock must not start a daemon with the default socket.
    parser = argparse.ArgumentParser(prog="topod", description="topology daemon for GPU servers", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"topod {__version__}")
    parser.add_argument("--root", default=None, help="host root (default / or [daemon] root)")
    parser.add_argument("--config", default=None, help="TOML config file (default: built-in defaults)")
    parser.add_argument("--socket", default=None, help="API socket path (default /run/topod/topod.sock)")
    parser.add_argument("--state-dir", default=None, help="lease database directory (default /var/lib/topod)")
    parser.add_argument("--check-config", metavar="FILE", default=None,
                        help="validate FILE and exit (0 valid, 1 invalid)")
    parser.add_argument("--log-format", choices=("auto", "console", "json", "journal"), default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from topod.config import load_config

    if args.check_config:
        try:
            load_config(args.check_config)
        except TopodError as exc:
            print(f"topod: {exc}", file=sys.stderr)
            return 1
        print(f"{args.check_config}: valid")
        return 0
    try:
        config = load_config(args.config).with_overrides(
            root=args.root, socket=args.socket, state_dir=args.state_dir)
        from topod.service.logsetup import setup_logging

        setup_logging(args.log_format or config.get("log", "format"), config.get("log", "level"))
        import faulthandler

        # A fatal signal (SIGBUS from a lease database whose mapping failed, SIGSEGV in a
        # C extension) writes the Python stacks to stderr, the journal: never a silent exit.
        faulthandler.enable()
        from topod.service.daemon import Daemon

        daemon = Daemon(config, config_path=args.config)
        asyncio.run(daemon.run())
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 - one clear line, never a traceback
        if isinstance(exc, SystemExit):
            raise
        return _fatal(exc, args.config)
    return 0


def _fatal(exc: BaseException, config_path: str | None = None) -> int:
    """A start-up or fatal error as one line. TaskGroup failures arrive wrapped in an
    ExceptionGroup: the first leaf is the cause. A configuration error exits EX_CONFIG."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, ConfigError):
        where = f"{config_path}: " if config_path and not str(exc).startswith(config_path) else ""
        print(f"topod: configuration error (not restarted until fixed): {where}{exc}", file=sys.stderr)
        return EX_CONFIG
    if isinstance(exc, (TopodError, OSError, ValueError)):
        print(f"topod: {exc}", file=sys.stderr)
    else:
        print(f"topod: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
