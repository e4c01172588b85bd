"""Logging: native journal entries under systemd, readable lines on a terminal.

Under systemd every structlog event becomes one journal entry whose fields can be
queried, e.g. `journalctl -u topod TOPOD_EVENT=irq_moved TOPOD_IRQ=42`:

    MESSAGE=irq_moved irq=42 to=3      (what journalctl prints)
    PRIORITY=6                         (from the log level)
    SYSLOG_IDENTIFIER=topod
    TOPOD_EVENT=irq_moved
    TOPOD_<KEY>=<value>                (every event field; non-strings as compact JSON)

The native protocol (systemd.journal-fields(7), "Native Journal Protocol") is written
here rather than taken from a library: systemd-python needs libsystemd-dev and a C
compiler, cysystemd installs as a wheel but, like systemd-python, calls
sd_journal_sendv(), which always talks to /run/systemd/journal/socket, so neither can
be pointed at a test socket. The protocol is small: one datagram of `KEY=value\\n`
lines, with `KEY\\n<u64 LE length><value>\\n` for values holding a newline; an entry
too large for a datagram goes in a sealed memfd passed with SCM_RIGHTS, as libsystemd
does. journald's own limits still apply (it drops entries over its size caps).
"""

from __future__ import annotations

import array
import errno
import fcntl
import functools
import json
import logging
import os
import re
import socket
import stat
import struct
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

import structlog

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "topod"
FIELD_PREFIX = "TOPOD_"

# structlog level name -> syslog priority (journalctl -p uses these numbers).
PRIORITIES = {"critical": 2, "fatal": 2, "exception": 3, "error": 3, "warning": 4, "warn": 4,
              "notice": 5, "info": 6, "debug": 7}
# Keys that become dedicated journal fields or are supplied by journald itself.
_NOT_EVENT_FIELDS = {"event", "level", "timestamp"}
_INVALID_FIELD_CHARS = re.compile(r"[^A-Z0-9_]")
_MAX_FIELD_NAME = 64  # journald ignores longer field names
_NEEDS_QUOTES = re.compile(r'[\s"=]')
_JSON_CONSTANTS = {None: "null", True: "true", False: "false"}


# -- pure encoding ---------------------------------------------------------------------
@functools.lru_cache(maxsize=1024)  # a daemon logs a few dozen distinct keys, per event
def field_name(key: str, prefix: str = FIELD_PREFIX) -> str:
    """'gpu-id' -> 'TOPOD_GPU_ID': upper-cased, anything outside [A-Z0-9_] becomes '_',
    cut at journald's 64-character limit. The prefix keeps names from starting with
    '_' (trusted fields journald would reject) or a digit."""
    name = prefix + _INVALID_FIELD_CHARS.sub("_", key.upper())
    if len(name) > _MAX_FIELD_NAME:
        name = name[:_MAX_FIELD_NAME]
    return name


def field_text(value: Any) -> str:
    """A field value as text: strings as they are, everything else as compact JSON
    (42, true, null, [0,1]) so values stay parseable from `journalctl -o json`."""
    kind = type(value)
    if kind is str:
        return value
    if kind is int:  # the common values first: no JSON encoder for them
        return str(value)
    if value is None or kind is bool:
        return _JSON_CONSTANTS[value]
    if kind is list and all(type(item) is int for item in value):
        return "[" + ",".join(map(str, value)) + "]"
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        value = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


# Field names encode_field has accepted: the next entry with them is encoded in one piece.
_CHECKED_NAMES: set[str] = set()


def encode_field(name: str, value: str | bytes) -> bytes:
    """One field in the native protocol. Values with a newline use the binary-safe
    form: NAME, newline, 64-bit little-endian length, the bytes, newline."""
    if not name or "=" in name or "\n" in name:
        raise ValueError(f"invalid journal field name {name!r}")
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    key = name.encode("ascii")
    if b"\n" in data:
        return key + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return key + b"=" + data + b"\n"


def encode_entry(fields: Iterable[tuple[str, str | bytes]]) -> bytes:
    fields = list(fields)
    if all(type(value) is str and "\n" not in value and name in _CHECKED_NAMES for name, value in fields):
        # The common entry: known names, one-line text values; encoded in one piece.
        return "".join([f"{name}={value}\n" for name, value in fields]).encode("utf-8", "surrogateescape")
    encoded = b"".join(encode_field(name, value) for name, value in fields)
    if len(_CHECKED_NAMES) < 4096:  # each was valid, or encode_field raised
        _CHECKED_NAMES.update(name for name, _ in fields)
    return encoded


def parse_entry(data: bytes) -> list[tuple[str, bytes]]:
    """The inverse of encode_entry (what journald does with the datagram). Raises
    ValueError on a truncated or malformed entry."""
    fields: list[tuple[str, bytes]] = []
    pos = 0
    while pos < len(data):
        newline = data.find(b"\n", pos)
        if newline < 0:
            raise ValueError(f"journal entry truncated at byte {pos}: no newline")
        line = data[pos:newline]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            fields.append((name.decode("ascii"), value))
            pos = newline + 1
            continue
        start = newline + 1 + 8
        if start > len(data):
            raise ValueError(f"journal field {line!r}: length header truncated")
        (size,) = struct.unpack("<Q", data[newline + 1:start])
        end = start + size
        if end + 1 > len(data) or data[end:end + 1] != b"\n":
            raise ValueError(f"journal field {line!r}: value of {size} bytes truncated or unterminated")
        fields.append((line.decode("ascii"), data[start:end]))
        pos = end + 1
    return fields


def message_line(event: str, fields: Mapping[str, Any]) -> str:
    """'irq_moved irq=42 to=3': the event then key=value, quoting values with spaces."""
    return _message_line(event, [(key, field_text(value)) for key, value in fields.items()])


def _message_line(event: str, texts: list[tuple[str, str]]) -> str:
    parts = [event]
    for key, text in texts:
        if not text or _NEEDS_QUOTES.search(text):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def event_fields(event_dict: Mapping[str, Any], method_name: str = "info",
                 identifier: str = IDENTIFIER) -> list[tuple[str, str]]:
    """A structlog event dict -> the journal entry's fields (pure)."""
    event = str(event_dict.get("event", ""))
    level = str(event_dict.get("level", method_name)).lower()
    extra = {k: v for k, v in event_dict.items() if k not in _NOT_EVENT_FIELDS}
    exception = extra.pop("exception", None)
    texts = [(key, field_text(value)) for key, value in extra.items()]  # each value encoded once
    message = _message_line(event, texts)
    if exception:
        message += "\n" + str(exception).rstrip("\n")
    fields = [("MESSAGE", message), ("PRIORITY", str(PRIORITIES.get(level, 6))),
              ("SYSLOG_IDENTIFIER", identifier), ("TOPOD_EVENT", event)]
    fields.extend((field_name(key), text) for key, text in texts)
    if exception:
        fields.append(("TOPOD_EXCEPTION", str(exception)))
    return fields


# -- transport ---------------------------------------------------------------------
class JournalSender:
    """Sends encoded entries to journald's datagram socket (path injectable for tests)."""

    def __init__(self, path: str = JOURNAL_SOCKET, timeout: float = 1.0) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # journald may apply back-pressure; a log call may wait briefly but never hang. The
        # kernel's send timeout (EAGAIN when it runs out) spares the poll() a Python
        # socket timeout makes before every send.
        seconds = int(timeout)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                              struct.pack("ll", seconds, int((timeout - seconds) * 1e6)))

    def usable(self) -> str | None:
        """None when journald (or whoever) listens at the path, else the reason not."""
        try:
            mode = os.stat(self.path).st_mode
        except OSError as exc:
            return f"{self.path}: {exc.strerror}"
        if not stat.S_ISSOCK(mode):
            return f"{self.path} is not a socket"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            probe.connect(self.path)  # a datagram connect sends nothing; it fails if nobody is bound
        except OSError as exc:
            return f"{self.path}: {exc.strerror}"
        finally:
            probe.close()
        return None

    def send(self, entry: bytes) -> None:
        """Raises OSError when journald cannot be reached."""
        try:
            self._sock.sendto(entry, self.path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(entry)  # larger than a datagram may be

    def _send_memfd(self, entry: bytes) -> None:
        fd = os.memfd_create("journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(entry)
            while view:
                view = view[os.write(fd, view):]
            # journald only accepts a memfd nobody can change after it looks.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
            self._sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._sock.close()


class JournalLogger:
    """The structlog 'logger' under the journal renderer: every level sends the entry;
    if journald is unreachable the line goes to `fallback` so nothing is lost silently."""

    def __init__(self, sender: JournalSender, fallback: TextIO | None = None) -> None:
        self.sender = sender
        self.fallback = fallback if fallback is not None else sys.stderr
        self.failures = 0

    def msg(self, entry: bytes) -> None:
        try:
            self.sender.send(entry)
        except OSError as exc:
            self.failures += 1
            line = dict(parse_entry(entry)).get("MESSAGE", b"").decode("utf-8", "replace")
            print(f"{line} (journal unreachable: {exc.strerror or exc})", file=self.fallback, flush=True)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


class JournalLoggerFactory:
    def __init__(self, sender: JournalSender, fallback: TextIO | None = None) -> None:
        self._logger = JournalLogger(sender, fallback)

    def __call__(self, *args: Any) -> JournalLogger:
        return self._logger


def journal_renderer(identifier: str = IDENTIFIER):
    """The final structlog processor: event dict -> encoded native journal entry."""

    def render(_logger: Any, method_name: str, event_dict: dict[str, Any]) -> bytes:
        return encode_entry(event_fields(event_dict, method_name, identifier))

    return render


# -- choosing and installing ---------------------------------------------------------
def stderr_is_journal(environ: Mapping[str, str] | None = None, stream: TextIO | None = None) -> bool:
    """True when systemd connected `stream` (default stderr) to the journal: JOURNAL_STREAM
    ('<dev>:<inode>') names the very file the stream writes to."""
    env = os.environ if environ is None else environ
    value = env.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat((stream if stream is not None else sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def configure_logging(stream_is_journal: bool | None = None, level: int = logging.INFO, *,
                      socket_path: str = JOURNAL_SOCKET, stream: TextIO | None = None,
                      environ: Mapping[str, str] | None = None, identifier: str = IDENTIFIER) -> str:
    """Install the structlog configuration and return what was chosen, for the start log.

    stream_is_journal: True forces native journal entries; False forces console lines;
    None decides: journal when JOURNAL_STREAM says stderr is the journal and the journal
    socket answers. (A journal socket alone is not enough: on a systemd host it exists
    in every terminal session too, and a hand-started topod should print to it.)
    Returns 'journal', 'console', or 'console (<why the journal was not used>)'."""
    out = stream if stream is not None else sys.stderr
    wants_journal = stderr_is_journal(environ, out) if stream_is_journal is None else stream_is_journal
    reason: str | None = None
    if wants_journal:
        sender = JournalSender(socket_path)
        reason = sender.usable()
        if reason is None:
            _install([journal_renderer(identifier)], JournalLoggerFactory(sender, out), level)
            return "journal"
        sender.close()
    colors = bool(getattr(out, "isatty", lambda: False)())
    renderer = structlog.dev.ConsoleRenderer(colors=colors)
    _install([structlog.processors.TimeStamper(fmt="iso"), renderer], structlog.PrintLoggerFactory(out), level)
    if reason is not None:
        structlog.get_logger(identifier).warning("journal_unavailable", reason=reason, fallback="stderr")
        return f"console ({reason})"
    return "console"


def _install(tail: list, factory: Any, level: int) -> None:
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.format_exc_info, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
