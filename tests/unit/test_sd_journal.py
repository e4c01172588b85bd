"""Native journal protocol: encoding (pure) and real entries over a datagram socket."""

from __future__ import annotations

import array
import fcntl
import io
import logging
import os
import shutil
import socket
import struct
import tempfile

import pytest
import structlog

from topod.service.journal import (
    JournalSender,
    configure_logging,
    encode_entry,
    encode_field,
    event_fields,
    field_name,
    field_text,
    parse_entry,
    stderr_is_journal,
)


# -- pure encoding ------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "name"), [
    ("irq", "TOPOD_IRQ"),
    ("gpu-id", "TOPOD_GPU_ID"),
    ("from.cpu", "TOPOD_FROM_CPU"),
    ("_pid", "TOPOD__PID"),
    ("3d", "TOPOD_3D"),
    ("numa_nœud", "TOPOD_NUMA_N_UD"),
    ("x" * 100, "TOPOD_" + "X" * 58),
])
def test_field_names_are_valid_journal_names(key, name):
    assert field_name(key) == name
    assert len(field_name(key)) <= 64


@pytest.mark.parametrize(("value", "text"), [
    ("plain", "plain"), (42, "42"), (0.25, "0.25"), (True, "true"), (None, "null"),
    ([0, 1], "[0,1]"), ((2, 3), "[2,3]"), ({3, 1}, "[1,3]"), ({"b": 1, "a": 2}, '{"a":2,"b":1}'),
    (False, "false"), (-3, "-3"), ([], "[]"), ([True, 0], "[true,0]"), ([1, "a"], '[1,"a"]'),
    (10**30, str(10**30)), (float("nan"), "NaN"),
])
def test_field_values_are_strings_or_compact_json(value, text):
    assert field_text(value) == text


def test_a_value_with_a_newline_uses_the_binary_safe_form():
    assert encode_field("TOPOD_NOTE", "a\nb") == b"TOPOD_NOTE\n" + struct.pack("<Q", 3) + b"a\nb\n"
    assert encode_field("TOPOD_IRQ", "42") == b"TOPOD_IRQ=42\n"


def test_entries_parse_back_exactly():
    fields = [("MESSAGE", "two\nlines\n"), ("EMPTY", ""), ("BIN", b"\x00\xff=\n"), ("EQ", "a=b")]
    assert parse_entry(encode_entry(fields)) == [
        ("MESSAGE", b"two\nlines\n"), ("EMPTY", b""), ("BIN", b"\x00\xff=\n"), ("EQ", b"a=b")]


@pytest.mark.parametrize("fields", [
    [("MESSAGE", "lease_granted lease=L1 gpus=[0]"), ("PRIORITY", "6"), ("TOPOD_LEASE", "L1")],
    [("MESSAGE", "numa_nœud \udcff"), ("TOPOD_NOTE", "")],  # non-ASCII and a surrogate, as before
    [("MESSAGE", "x"), ("TOPOD_NOTE", "a\nb"), ("TOPOD_IRQ", "42")],  # a newline: the binary-safe form
    [("MESSAGE", "x"), ("BIN", b"\x00=")],  # bytes as they are
])
def test_an_entry_encodes_as_its_fields_one_by_one_the_first_time_and_the_next(fields):
    """The one-piece encoding of entries whose names were accepted before gives the same
    bytes as encode_field field by field."""
    expected = b"".join(encode_field(name, value) for name, value in fields)
    assert encode_entry(fields) == expected  # names not seen before: checked one by one
    assert encode_entry(fields) == expected  # seen: the one-piece path when every value is one line of text


def test_an_invalid_name_is_refused_even_beside_names_accepted_before():
    encode_entry([("MESSAGE", "x")])
    with pytest.raises(ValueError, match="invalid journal field name"):
        encode_entry([("MESSAGE", "x"), ("A=B", "y")])


@pytest.mark.parametrize("name", ["", "A=B", "A\nB"])
def test_invalid_field_names_are_refused(name):
    with pytest.raises(ValueError, match="invalid journal field name"):
        encode_field(name, "x")


@pytest.mark.parametrize(("data", "message"), [
    (b"MESSAGE=no newline", "no newline"),
    (b"MESSAGE\n\x05\x00", "length header truncated"),
    (b"MESSAGE\n" + struct.pack("<Q", 10) + b"short\n", "truncated or unterminated"),
])
def test_malformed_entries_are_named(data, message):
    with pytest.raises(ValueError, match=message):
        parse_entry(data)


def test_event_fields_carry_message_priority_identifier_and_every_field():
    fields = event_fields({"event": "irq_moved", "level": "warning", "irq": 42, "to": [3], "timestamp": "t"})
    assert fields == [
        ("MESSAGE", "irq_moved irq=42 to=[3]"), ("PRIORITY", "4"), ("SYSLOG_IDENTIFIER", "topod"),
        ("TOPOD_EVENT", "irq_moved"), ("TOPOD_IRQ", "42"), ("TOPOD_TO", "[3]")]


def test_message_quotes_values_with_spaces():
    fields = dict(event_fields({"event": "config_rejected", "reason": "bad key", "path": ""}))
    assert fields["MESSAGE"] == 'config_rejected reason="bad key" path=""'


# -- real sockets -------------------------------------------------------------------------
@pytest.fixture()
def journald():
    """A datagram socket where journald's would be; yields (path, receive)."""
    directory = tempfile.mkdtemp(prefix="sdj", dir="/tmp")
    path = os.path.join(directory, "socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2.0)

    def receive() -> dict[str, bytes]:
        data, ancillary, _flags, _addr = sock.recvmsg(1 << 22, socket.CMSG_SPACE(array.array("i").itemsize))
        if not data and ancillary:  # the memfd form
            fds = array.array("i")
            fds.frombytes(ancillary[0][2])
            with os.fdopen(fds[0], "rb") as memfd:
                seals = fcntl.fcntl(memfd.fileno(), fcntl.F_GET_SEALS)
                assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL, "journald requires a sealed memfd"
                data = os.pread(memfd.fileno(), os.fstat(memfd.fileno()).st_size, 0)
            receive.via_memfd = True
        return dict(parse_entry(data))

    receive.via_memfd = False
    yield path, receive, sock
    sock.close()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _restore_structlog():
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def test_events_arrive_as_native_entries_with_queryable_fields(journald):
    path, receive, _ = journald
    assert configure_logging(True, socket_path=path, stream=io.StringIO()) == "journal"
    structlog.get_logger().info("irq_moved", irq=42, cpus=[4, 5], device="0000:17:00.0", reason="line one\nline two")
    entry = receive()
    assert entry == {
        "MESSAGE": b'irq_moved irq=42 cpus=[4,5] device=0000:17:00.0 reason="line one\\nline two"',
        "PRIORITY": b"6",
        "SYSLOG_IDENTIFIER": b"topod",
        "TOPOD_EVENT": b"irq_moved",
        "TOPOD_IRQ": b"42",
        "TOPOD_CPUS": b"[4,5]",
        "TOPOD_DEVICE": b"0000:17:00.0",
        "TOPOD_REASON": b"line one\nline two",
    }


def test_levels_map_to_syslog_priorities_and_debug_is_filtered(journald):
    path, receive, _ = journald
    configure_logging(True, level=logging.INFO, socket_path=path, stream=io.StringIO())
    log = structlog.get_logger()
    log.debug("not_sent")
    log.warning("link_degraded")
    log.error("apply_failed")
    log.critical("store_corrupt")
    assert [(e["TOPOD_EVENT"], e["PRIORITY"]) for e in (receive(), receive(), receive())] == [
        (b"link_degraded", b"4"), (b"apply_failed", b"3"), (b"store_corrupt", b"2")]


def test_exceptions_become_a_multi_line_message_and_field(journald):
    path, receive, _ = journald
    configure_logging(True, socket_path=path, stream=io.StringIO())
    try:
        raise RuntimeError("probe crashed")
    except RuntimeError:
        structlog.get_logger().exception("probe_failed", gpu=3)
    entry = receive()
    assert entry["PRIORITY"] == b"3"
    assert entry["TOPOD_GPU"] == b"3"
    assert entry["TOPOD_EXCEPTION"].startswith(b"Traceback (most recent call last):")
    assert entry["TOPOD_EXCEPTION"].rstrip().endswith(b"RuntimeError: probe crashed")
    first, _, rest = entry["MESSAGE"].partition(b"\n")
    assert first == b"probe_failed gpu=3" and b"RuntimeError: probe crashed" in rest


def test_an_entry_too_large_for_a_datagram_goes_through_a_sealed_memfd(journald):
    path, receive, _ = journald
    configure_logging(True, socket_path=path, stream=io.StringIO())
    big = "x" * (2 << 20)
    structlog.get_logger().info("snapshot_taken", tree=big)
    entry = receive()
    assert receive.via_memfd
    assert entry["TOPOD_TREE"] == big.encode()


def test_sender_reports_an_unreachable_journal_as_oserror(journald):
    path, _receive, sock = journald
    sender = JournalSender(path)
    sock.close()
    with pytest.raises(OSError):
        sender.send(encode_entry([("MESSAGE", "x")]))


def test_a_journal_that_stops_reading_fails_a_send_within_its_timeout_never_hangs(journald):
    """Back-pressure: nobody reads the socket and its queue fills; a send waits at most
    the sender's timeout (the kernel's send timeout), then fails as OSError (the logger
    then prints the line to stderr)."""
    import time

    path, _receive, _sock = journald
    sender = JournalSender(path, timeout=0.2)
    entry = encode_entry([("MESSAGE", "x" * 4000)])
    started = time.monotonic()
    with pytest.raises(OSError):
        for _ in range(100_000):  # the receive queue holds far fewer
            sender.send(entry)
    assert time.monotonic() - started < 10
    waited = time.monotonic()
    with pytest.raises(OSError):
        sender.send(entry)
    assert 0.1 <= time.monotonic() - waited < 2, "waited about its timeout, no longer"


def test_lines_are_not_lost_when_journald_goes_away(journald):
    path, _receive, sock = journald
    stream = io.StringIO()
    configure_logging(True, socket_path=path, stream=stream)
    sock.close()
    os.unlink(path)
    structlog.get_logger().info("lease_granted", lease="L1")
    assert "lease_granted lease=L1 (journal unreachable:" in stream.getvalue()


def test_forced_journal_without_a_socket_falls_back_to_console_visibly(tmp_path):
    stream = io.StringIO()
    mode = configure_logging(True, socket_path=str(tmp_path / "missing"), stream=stream)
    assert mode.startswith("console (") and "missing" in mode
    assert "journal_unavailable" in stream.getvalue()
    structlog.get_logger().info("daemon_started", gpus=8)
    assert "daemon_started" in stream.getvalue() and "gpus=8" in stream.getvalue()


def test_a_path_that_is_not_a_socket_is_not_used(tmp_path):
    plain = tmp_path / "socket"
    plain.write_text("")
    assert JournalSender(str(plain)).usable() == f"{plain} is not a socket"


def test_a_stale_socket_file_is_not_used(journald):
    path, _receive, sock = journald
    sock.close()  # the file stays, nobody is bound to it
    assert "Connection refused" in JournalSender(path).usable()


def test_auto_uses_the_journal_when_journal_stream_names_stderr(journald, tmp_path):
    path, receive, _ = journald
    with open(tmp_path / "stderr", "w") as stream:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert stderr_is_journal(env, stream)
        assert configure_logging(None, socket_path=path, stream=stream, environ=env) == "journal"
        structlog.get_logger().info("probe_done")
        assert receive()["TOPOD_EVENT"] == b"probe_done"


def test_auto_prints_lines_when_stderr_is_not_the_journal(journald, tmp_path):
    path, _receive, sock = journald
    with open(tmp_path / "stderr", "w") as stream:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}  # stderr was redirected elsewhere
        assert configure_logging(None, socket_path=path, stream=stream, environ=env) == "console"
        structlog.get_logger().info("probe_done", gpu=1)
    assert "probe_done" in (tmp_path / "stderr").read_text()
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(10)


@pytest.mark.parametrize("value", ["", "12", "a:b", "1:2:3", ":5"])
def test_malformed_journal_stream_means_not_the_journal(value, tmp_path):
    with open(tmp_path / "f", "w") as stream:
        assert not stderr_is_journal({"JOURNAL_STREAM": value}, stream)


def test_a_stream_without_a_file_descriptor_is_not_the_journal():
    assert not stderr_is_journal({"JOURNAL_STREAM": "1:2"}, io.StringIO())


def test_a_library_record_is_one_journal_entry_with_priority_and_its_traceback_as_a_field(journald):
    from topod.service.logsetup import LibraryLogHandler, route_library_logs

    path, receive, _ = journald
    configure_logging(True, socket_path=path, stream=io.StringIO())
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    route_library_logs(logging.INFO)
    try:
        try:
            raise ValueError("line too long")
        except ValueError as exc:
            logging.getLogger("aiohttp.server").error("Error handling request", exc_info=exc)
        entry = receive()
    finally:
        root.handlers[:] = [h for h in handlers if not isinstance(h, LibraryLogHandler)]
        root.setLevel(level)
        logging.captureWarnings(False)
    assert (entry["TOPOD_EVENT"], entry["PRIORITY"], entry["TOPOD_LOGGER"]) == (b"library_log", b"3",
                                                                                  b"aiohttp.server")
    assert entry["TOPOD_TRACEBACK"].startswith(b"Traceback (most recent call last):")
    assert entry["TOPOD_TRACEBACK"].rstrip().endswith(b"ValueError: line too long")
