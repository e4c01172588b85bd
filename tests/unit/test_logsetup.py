"""Library log records (aiohttp, asyncio, warnings) become topod events, one per record,
and topod's own tracebacks survive the JSON renderer."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import structlog

from topod.service.logsetup import LibraryLogHandler, method_of_level, route_library_logs, setup_logging


@pytest.fixture()
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def _json_lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_library_traceback_is_one_json_event_with_the_traceback_as_a_field(restore_logging, capsys):
    setup_logging("json", "info")
    try:
        raise ValueError("bad chunk")
    except ValueError as exc:
        logging.getLogger("aiohttp.server").error("Error handling request from %s", "peer", exc_info=exc)
    [event] = _json_lines(capsys)
    assert event["event"] == "library_log" and event["level"] == "error"
    assert event["logger"] == "aiohttp.server" and event["message"] == "Error handling request from peer"
    assert event["traceback"].startswith("Traceback (most recent call last):")
    assert event["traceback"].rstrip().endswith("ValueError: bad chunk")


def test_library_records_follow_topods_level_and_custom_levels_round_down(restore_logging, capsys):
    setup_logging("json", "warning")
    logging.getLogger("asyncio").info("not shown at warning")
    logging.getLogger("asyncio").log(35, "between warning and error")
    [event] = _json_lines(capsys)
    assert (event["level"], event["message"], "traceback" in event) == ("warning", "between warning and error", False)
    assert [method_of_level(n) for n in (5, 10, 25, 30, 45, 50, 60)] == \
        ["debug", "debug", "info", "warning", "error", "critical", "critical"]


def test_python_warnings_are_routed_too(restore_logging, capsys):
    setup_logging("json", "info")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("an old API", DeprecationWarning, stacklevel=1)
    [event] = _json_lines(capsys)
    assert event["logger"] == "py.warnings" and "DeprecationWarning: an old API" in event["message"]


def test_setting_up_twice_leaves_one_handler(restore_logging, capsys):
    setup_logging("json", "info")
    setup_logging("json", "info")
    assert sum(isinstance(h, LibraryLogHandler) for h in logging.getLogger().handlers) == 1
    logging.getLogger("aiohttp.web").warning("once")
    assert len(_json_lines(capsys)) == 1


def test_topods_own_exception_keeps_its_traceback_in_json(restore_logging, capsys):
    setup_logging("json", "info")
    try:
        raise RuntimeError("reload broke")
    except RuntimeError:
        structlog.get_logger("topod").exception("reload_failed", error="x")
    [event] = _json_lines(capsys)
    assert event["event"] == "reload_failed" and "RuntimeError: reload broke" in event["exception"]


def test_a_handler_that_cannot_render_does_not_raise_into_the_library(restore_logging, capsys):
    route_library_logs(logging.INFO)
    structlog.configure(processors=[lambda *_: (_ for _ in ()).throw(RuntimeError("renderer down"))],
                        logger_factory=structlog.PrintLoggerFactory(), cache_logger_on_first_use=False)
    logging.raiseExceptions = True
    logging.getLogger("aiohttp.server").warning("still fine")  # handleError reports, never raises
    assert "renderer down" in capsys.readouterr().err


def test_a_repeated_library_message_is_passed_on_once_per_window_with_a_count(restore_logging, capsys):
    setup_logging("json", "info")
    now = [100.0]
    handler = next(h for h in logging.getLogger().handlers if isinstance(h, LibraryLogHandler))
    handler.clock = lambda: now[0]
    server = logging.getLogger("aiohttp.server")
    for peer in range(50):  # a flood of bad requests: one template, many peers
        server.error("Error handling request from %s", peer, exc_info=ValueError("bad"))
    server.error("Unhandled exception")  # another template passes
    now[0] += 10.0
    server.error("Error handling request from %s", "late")
    events = _json_lines(capsys)
    assert [(e["message"], e.get("repeats_dropped")) for e in events] == [
        ("Error handling request from 0", None), ("Unhandled exception", None),
        ("Error handling request from late", 49)]
