"""Logging: native journal entries under systemd, readable lines on a terminal, JSON lines
on request. What libraries log through the standard logging module (aiohttp, asyncio,
Python's warnings) goes the same way, one structured event per record."""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LIBRARY_EVENT = "library_log"


def setup_logging(fmt: str, level: str) -> None:
    numeric = LEVELS.get(level, logging.INFO)
    try:
        from topod.service.journal import configure_logging
    except ImportError:
        configure_logging = None
    if configure_logging is not None and fmt in ("auto", "journal"):
        configure_logging(stream_is_journal=True if fmt == "journal" else None, level=numeric)
    else:
        if fmt == "json":  # JSON cannot hold a traceback object: format_exc_info makes it a field
            tail = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(serializer=_json_line)]
        else:  # the console renderer prints tracebacks itself
            tail = [structlog.dev.ConsoleRenderer(colors=False)]
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"), *tail],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
            cache_logger_on_first_use=True,
        )
    route_library_logs(numeric)


# One encoder per `default` (JSONRenderer passes structlog's own fallback, always the same):
# json.dumps with any keyword builds a new encoder per call, a third of a short line's cost
# (each lease grant and release logs one).
_ENCODERS: dict[object, json.JSONEncoder] = {}


def _json_line(event_dict: dict, *, default: object = None, **_: object) -> str:
    encoder = _ENCODERS.get(default)
    if encoder is None:
        encoder = _ENCODERS[default] = json.JSONEncoder(default=default)
    return encoder.encode(event_dict)


REPEAT_WINDOW_SECONDS = 10.0


class LibraryLogHandler(logging.Handler):
    """A standard-logging record as a topod event: `library_log` with the logger's name,
    the message, and any traceback as one field. Without it Python's last-resort handler
    prints bare lines (a traceback under journald is one entry per line, with no level
    and no fields).

    The same message of the same logger is passed on at most once per
    REPEAT_WINDOW_SECONDS; the next one that passes says how many were dropped. A library
    may log per request (aiohttp's server logs a traceback for each request it cannot
    parse, on the TCP metrics listener too): a client must not be able to grow the log."""

    def __init__(self, clock=time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}  # (logger, message template) -> when passed on
        self._dropped: dict[tuple[str, str], int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            key = (record.name, str(record.msg))
            now = self.clock()
            if now - self._last.get(key, -1e18) < REPEAT_WINDOW_SECONDS:
                self._dropped[key] = self._dropped.get(key, 0) + 1
                return
            if len(self._last) > 1024:  # bounded: templates, not messages, but a library may vary them
                self._last.clear()
                self._dropped.clear()
            self._last[key] = now
            fields: dict[str, object] = {"logger": record.name, "message": record.getMessage()}
            if dropped := self._dropped.pop(key, 0):
                fields["repeats_dropped"] = dropped
            if record.exc_info and record.exc_info[1] is not None:
                fields["traceback"] = "".join(traceback.format_exception(*record.exc_info))
            method = getattr(structlog.get_logger("topod"), method_of_level(record.levelno))
            method(LIBRARY_EVENT, **fields)
        except Exception:  # noqa: BLE001 - logging must never raise into its caller
            self.handleError(record)


def method_of_level(levelno: int) -> str:
    """The structlog method for a standard level, custom levels rounded down to a standard one."""
    for threshold, name in ((logging.CRITICAL, "critical"), (logging.ERROR, "error"),
                            (logging.WARNING, "warning"), (logging.INFO, "info")):
        if levelno >= threshold:
            return name
    return "debug"


def route_library_logs(level: int) -> LibraryLogHandler:
    """Install (once; again replaces) the handler on the root logger, at topod's level."""
    root = logging.getLogger()
    for old in [handler for handler in root.handlers if isinstance(handler, LibraryLogHandler)]:
        root.removeHandler(old)
    handler = LibraryLogHandler()
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn(...) as records of the 'py.warnings' logger
    return handler
