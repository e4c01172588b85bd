"""`topod`: the daemon's entry point (foreground; systemd runs it as Type=notify)."""

from __future__ import annotations

import argparse
import sys

from topod import __version__
from topod.errors import ConfigError, TopodError

# sysexits' EX_CONFIG: the configuration file is wrong, and starting again will not help.
# The unit does not restart on it (RestartPreventExitStatus=78); every other fatal error
# is restarted: 1, and EX_TEMPFAIL when another topod holds the state directory (it may be
# stopping: a restart a moment later succeeds).
EX_CONFIG = 78
EX_TEMPFAIL = 75
# Every status topod exits with: the man page and docs/operations.md list these.
EXIT_STATUS = (
    (0, "stopped cleanly (SIGTERM); --check-config: the file is valid"),
    (1, "a fatal error (one line on standard error; restarted by the unit); --check-config: the file is invalid"),
    (2, "usage error (an unknown option)"),
    (EX_TEMPFAIL, "the state directory is held by another topod (EX_TEMPFAIL; restarted by the unit)"),
    (EX_CONFIG, "a configuration error (EX_CONFIG; not restarted until fixed: RestartPreventExitStatus=78)"),
    (130, "interrupted (SIGINT in a terminal)"),
)

# Modules the daemon never uses that its libraries load when they are installed (issue
# 26, bench/footprint.py):
# - rich: structlog's console renderer formats tracebacks with it when present (here only
#   a test tool's dependency); kept out for good (~3 MiB PSS);
# - ssl and _hashlib: asyncio and aiohttp import ssl at start for TLS, which the daemon
#   never serves (a Unix socket, plain-HTTP metrics), and aiohttp's client hashlib, whose
#   OpenSSL backend it never uses: together they map libssl and libcrypto (~4 MiB PSS).
#   Kept out only while the daemon's own modules load, so that those libraries take
#   their no-TLS paths and hashlib its built-in digests. The standard modules that
#   define their TLS parts only when ssl imports (urllib.request's HTTPSHandler,
#   http.client's HTTPSConnection) are then dropped from sys.modules, so that whatever
#   imports them later (prometheus_client, on the first metrics scrape) gets them whole,
#   and ssl with them.
# - frozenlist's C++ extension (aiohttp's app, signal and middleware lists: built at
#   start, not in a request's path): the pure-Python one it documents
#   (FROZENLIST_NO_EXTENSIONS) leaves libstdc++ unmapped (~1 MiB PSS).
# - the system's MIME database (/etc/mime.types, 1,500 types): aiohttp builds its file
#   responses' type table at import, and the daemon serves no files; Python's own table
#   (~150 types) stands in (~0.4 MiB PSS).
# Only in the daemon's own process (a real command line, argv None): tests that call
# main(argv) in-process keep what they have.
NOT_LOADED = ("rich",)
NOT_LOADED_AT_START = ("ssl", "_hashlib")
WITHOUT_TLS_PARTS = ("urllib.request", "http.client")


def _import_lean() -> None:
    marked = [name for name in (*NOT_LOADED, *NOT_LOADED_AT_START) if name not in sys.modules]
    fresh = [name for name in WITHOUT_TLS_PARTS if name not in sys.modules]
    for name in marked:
        sys.modules[name] = None  # an import of it raises ImportError
    import os

    pure = "FROZENLIST_NO_EXTENSIONS" not in os.environ
    if pure:
        os.environ["FROZENLIST_NO_EXTENSIONS"] = "1"  # read once, when frozenlist loads
    import mimetypes

    known_files, mimetypes.knownfiles = mimetypes.knownfiles, []  # read once, at the first init()
    try:
        import asyncio  # noqa: F401
        import topod.service.daemon  # noqa: F401
        import topod.service.server  # noqa: F401 - aiohttp
    finally:
        mimetypes.knownfiles = known_files
        if pure:
            del os.environ["FROZENLIST_NO_EXTENSIONS"]  # not passed on to the IRQ worker
        for name in NOT_LOADED_AT_START:
            if name in marked and sys.modules.get(name, False) is None:
                del sys.modules[name]
        for name in fresh:
            sys.modules.pop(name, None)


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
    if argv is None:
        _import_lean()
    from topod.config import load_config

    if args.check_config:
        try:
            load_config(args.check_config)
        except TopodError as exc:
            print(f"topod: {exc}", file=sys.stderr)
            return 1
        print(f"{args.check_config}: valid")
        return 0
    made: str | None = None  # the first state directory this start creates, removed if it fails
    daemon = None
    try:
        config = load_config(args.config).with_overrides(
            root=args.root, socket=args.socket, state_dir=args.state_dir)
        made = _first_missing(config.get("daemon", "state_dir"))
        from topod.service.logsetup import setup_logging

        setup_logging(args.log_format or config.get("log", "format"), config.get("log", "level"))
        import faulthandler

        # A fatal signal (SIGBUS from a lease database whose mapping failed, SIGSEGV in a
        # C extension) writes the Python stacks to stderr, the journal: never a silent exit.
        faulthandler.enable()
        from topod.service.daemon import Daemon

        import asyncio

        daemon = Daemon(config, config_path=args.config)
        asyncio.run(daemon.run())
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 - one clear line, never a traceback
        if isinstance(exc, SystemExit):
            raise
        code = _fatal(exc, args.config)
        if made is not None and getattr(daemon, "api_address", None) is None:  # never served: no lease granted
            _remove_made(made)
        return code
    finally:
        _remove_own_socket()
    return 0


def _first_missing(path: str) -> str | None:
    """The outermost directory of `path` that does not exist yet (what a start would
    create), or None when it exists."""
    import os

    path = os.path.abspath(path)
    missing = None
    while path and not os.path.lexists(path):
        missing, parent = path, os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


# What a start that failed leaves in a state directory it created itself: nothing else is
# ever removed (a directory holding anything more stays, and says why the start failed).
_MADE_FILES = ("topod.lock", "leases.sqlite3", "leases.sqlite3-wal", "leases.sqlite3-shm", "leases.sqlite3-journal")


def _remove_made(top: str) -> None:
    """Undo the directories this failed start created under `top` (the state directory
    and any parents it made), with only the files a start writes in them."""
    import os

    for current, dirs, files in os.walk(top, topdown=False):
        for name in files:
            if name in _MADE_FILES:
                try:
                    os.unlink(os.path.join(current, name))
                except OSError:
                    pass
        try:
            os.rmdir(current)
        except OSError:
            return  # something else is there: leave it and everything above it


def _remove_own_socket() -> None:
    server = sys.modules.get("topod.service.server")  # not imported: nothing was bound
    if server is not None:
        server.remove_bound_sockets()


def _fatal(exc: BaseException, config_path: str | None = None) -> int:
    """A start-up or fatal error as one line. TaskGroup failures arrive wrapped in an
    ExceptionGroup: the first leaf is the cause. A configuration error exits EX_CONFIG."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, KeyboardInterrupt):
        return 130
    from topod.service.statelock import StateDirBusyError

    if isinstance(exc, StateDirBusyError):
        print(f"topod: {exc} (exit {EX_TEMPFAIL}: retried)", file=sys.stderr)
        return EX_TEMPFAIL
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
