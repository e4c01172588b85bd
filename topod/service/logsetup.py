"""Logging: native journal entries under systemd, readable lines on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging(fmt: str, level: str) -> None:
    try:
        from topod.service.journal import configure_logging
    except ImportError:
        configure_logging = None
    if configure_logging is not None and fmt in ("auto", "journal"):
        configure_logging(stream_is_journal=True if fmt == "journal" else None, level=LEVELS.get(level, logging.INFO))
        return
    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
