"""topoctl: the command-line client.

Start-up is kept lean: the parser comes from a light table (topod.cli.commands) with only
the chosen command populated, and the chosen handler's module is imported only now.
Handlers write their whole output at once; a reader that stops reading (`| head`) ends
topoctl silently with status 141, as SIGPIPE ends a coreutils tool; other errors writing
standard output (a full disk) are one line on stderr, never a traceback.
"""

from __future__ import annotations

import os
import sys

from topod.errors import TopodError


class StdoutError(Exception):
    """Writing standard output failed (EPIPE, ENOSPC, EIO, ...)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.error = error


# C0 controls but tab and newline, DEL, C1: on a terminal they act (colours, cursor
# moves, a title, a carriage return over a line) instead of showing. A captured tree can
# name a network interface with an ESC in it, and the daemon echoes what a caller sent.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def _is_terminal(stream) -> bool:  # noqa: ANN001 - any stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or capture stream
        return False


def terminal_safe(text: str, stream) -> str:  # noqa: ANN001 - any text stream
    """`text` with control characters shown as \\xNN when `stream` is a terminal; as it
    is otherwise (a pipe or a file gets the exact bytes)."""
    return text.translate(_CONTROLS) if _is_terminal(stream) else text


class _GuardedStream:
    """stdout, with write errors told apart from every other OSError, and control
    characters escaped when it is a terminal."""

    def __init__(self, stream) -> None:  # noqa: ANN001 - a text or binary stream
        self._stream = stream
        self._terminal = _is_terminal(stream)

    def write(self, data):  # noqa: ANN001, ANN201
        if self._terminal and isinstance(data, str):
            data = data.translate(_CONTROLS)
        try:
            return self._stream.write(data)
        except OSError as exc:
            raise StdoutError(exc) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutError(exc) from exc

    @property
    def buffer(self) -> _GuardedStream:
        return _GuardedStream(self._stream.buffer)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._stream, name)


def missing_subcommand(args) -> int:  # noqa: ANN001 - argparse.Namespace
    """`topoctl irq` or `topoctl export` without its subcommand: the command's help, status 2."""
    import argparse

    from topod.cli.commands import build_parser

    parser = build_parser([args.command_name])
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action.choices[args.command_name].print_help(sys.stderr)
    return 2


def _load(target: str):  # noqa: ANN202
    module_name, _, function = target.partition(":")
    module = __import__(module_name, fromlist=[function])
    return getattr(module, function)


def _report(exc: BaseException, as_json: bool) -> None:
    if as_json:
        import json

        sys.stderr.write(json.dumps({"code": getattr(exc, "code", "error"), "message": str(exc)}) + "\n")
    else:
        sys.stderr.write(terminal_safe(f"topoctl: {exc}", sys.stderr) + "\n")


def _stdout_failed(exc: StdoutError, stream, as_json: bool) -> int:  # noqa: ANN001 - the real sys.stdout
    import errno
    import os

    from topod.cli import exits

    try:  # nothing more can reach the reader, and Python's exit flush must not complain
        if stream.fileno() == 1:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    except (OSError, ValueError, AttributeError):
        pass  # a test's capture stream: nothing to silence
    if exc.error.errno == errno.EPIPE or isinstance(exc.error, BrokenPipeError):
        # The reader stopped reading (`topoctl ... | head`): silent, as a coreutils tool
        # that SIGPIPE ends, with the status a shell reports for one (141).
        return exits.PIPE
    error = TopodError(f"writing standard output: {exc}")
    error.code = "stdout_failed"
    _report(error, as_json)
    return exits.ERROR


def _os_error_text(exc: OSError) -> str:
    """'/x/y.tar.gz: No such file or directory' (topod.outfile names the file asked for)."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def _untranslated() -> None:
    """argparse looks every message up through gettext (a catalogue search per string,
    about 3 ms a start); topoctl's messages are English only, so skip the look-ups."""
    import argparse

    argparse._ = str
    argparse.ngettext = lambda singular, plural, n: singular if n == 1 else plural


def _fewer_collections() -> None:
    """A command's start-up (its imports, a discovery) makes tens of thousands of objects
    and frees few: with the default thresholds `topoctl topo --json` ran 23-26 collections
    over them, walking the growing heap (2-4 ms of a 40-75 ms run). Collect per
    100,000 new objects instead; a long-running command (watch) is still collected."""
    import gc

    gc.set_threshold(100_000)


def _end_process(code: int) -> None:
    """End a real command line's process now, with `code`: exit handlers run and the
    standard streams are flushed as at any exit, but the interpreter's teardown (every
    module and object freed one by one, a last collection) is skipped: ~4 ms of a 35-60
    ms `topoctl topo --json`. topoctl starts no threads to wait for, and every
    file it writes is closed by the command that wrote it."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the command said what went wrong with its output already
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if argv is None:  # a real command line (not a test calling main): this process is topoctl's
        _end_process(code)
    return code


def _main(argv: list[str] | None) -> int:
    if argv is None:
        _fewer_collections()
    from topod.cli.commands import BY_NAME, WholeParserNeeded, build_parser

    if argv is None:
        _untranslated()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except WholeParserNeeded:  # parsing has no effects: the whole parser tells the error, as it would
        parser = build_parser(argv, every_command=True)
        args = parser.parse_args(argv)
    target = getattr(args, "handler", None)
    if target is None:
        parser.print_help(sys.stderr)
        return 2
    if args.root is not None and not BY_NAME[args.command_name].host_side:
        build_parser(argv, every_command=True).error(
            f"--root: `topoctl {args.command_name}` reads no host root (it asks the daemon)")
    original = sys.stdout
    sys.stdout = _GuardedStream(original)
    try:
        code = int(_load(target)(args) or 0)
        sys.stdout.flush()
        return code
    except StdoutError as exc:
        return _stdout_failed(exc, original, getattr(args, "json", False))
    except BrokenPipeError as exc:
        return _stdout_failed(StdoutError(exc), original, getattr(args, "json", False))
    except TopodError as exc:
        from topod.cli.exits import exit_code_of

        _report(exc, getattr(args, "json", False))
        return exit_code_of(exc)
    except OSError as exc:  # a file the user named (an output path, a full disk): one line, status 1
        error = TopodError(_os_error_text(exc))
        error.code = "os_error"
        _report(error, getattr(args, "json", False))
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout = original


def build_parser():  # noqa: ANN201 - the full parser (help, completions, man pages, tests)
    from topod.cli.commands import build_parser as build

    return build()


if __name__ == "__main__":
    sys.exit(main())
