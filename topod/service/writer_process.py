"""The lease writer process: a child forked by the daemon that alone opens and writes the
lease database, fed batches through a pipe (topod.service.lease_writer drives it from the
event loop).

Why a process (issue 26): a writer thread shares the event loop's GIL. Each statement it
runs gives the GIL up while SQLite works and must win it back from the loop, which holds
it most of the time under load; measured with `bench/writer_prototype.py`, a thread
writer served 0.61-0.70 of a bare server's round trips, the same writer in a process
0.88-0.97. The process is forked, not started afresh: it shares the daemon's imported
pages and only copies the few it touches (gc frozen at once, so collections do not touch
the rest).

Both ends spin for a moment before they sleep: a pipe's wake-up costs ~50 us each way on
a VM, a fifth of a grant's answer. The child polls for the next batch for CHILD_SPIN_SECONDS
after a reply, but only while batches come closer together than that (a busy moment, never
an idle daemon); the loop polls for the answer of a lone change (lease_writer decides when).

The protocol is pickled tuples, each framed by its length: the pipe is private to a parent
and the child it forked, so nothing else can speak on it. Requests: (BATCH, sequence,
changes), (CHECKPOINT, mode), (CLOSE,). Replies: (READY, last batch) or (FAILED, why) once
at start, (BATCH, sequence, committed, outcomes), (CHECKPOINT, error), (CLOSE, error).
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import sqlite3
import struct
import time
from collections.abc import Callable
from typing import Any, NoReturn

from topod.service import lease_commit

BATCH, CHECKPOINT, CLOSE, READY, FAILED = "batch", "checkpoint", "close", "ready", "failed"
CHILD_SPIN_SECONDS = 0.0
_FRAME = struct.Struct("<I")
_READ_SIZE = 65536


class WriterGone(Exception):
    """The writer process ended (its pipe broke, or it did not answer in time)."""


class WriterOpenFailed(Exception):
    """The writer process could not open the database: the message says why."""


class WriterProcess:
    """The daemon's end of one writer process."""

    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid = pid
        self._requests = requests  # blocking: one batch in flight, which the child reads whole
        self._replies = replies  # non-blocking: the event loop polls it
        self._buffer = b""
        self._ended = False
        self.exit: str | None = None  # how it ended, once reaped

    @classmethod
    def start(cls, open_connection: Callable[[], sqlite3.Connection], timeout: float = 30.0) -> tuple[WriterProcess, Any]:
        """(the process, the last batch it found committed: lease_commit.last_batch);
        OSError when it cannot be forked, WriterOpenFailed when it cannot open the
        database, WriterGone when it ends before it is ready."""
        requests_out, requests_in = os.pipe()
        replies_out, replies_in = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (requests_out, requests_in, replies_out, replies_in):
                os.close(fd)
            raise
        if pid == 0:
            _child(requests_out, replies_in, open_connection)
        os.close(requests_out)
        os.close(replies_in)
        os.set_blocking(replies_out, False)
        process = cls(pid, requests_in, replies_out)
        try:
            reply = process.wait(timeout)
        except WriterGone:
            process.stop(0.0)
            raise
        if reply is None:
            process.kill()
            raise WriterGone(f"the lease writer process did not open the database within {timeout:.0f} s")
        if reply[0] == FAILED:
            process.stop(1.0)
            raise WriterOpenFailed(reply[1])
        return process, reply[1]

    def fileno(self) -> int:
        return self._replies

    def send(self, message: tuple) -> None:
        data = _frame(message)
        try:
            while data:
                data = data[os.write(self._requests, data):]
        except OSError as exc:  # EPIPE: it ended
            raise WriterGone(f"the lease writer process's pipe broke ({exc.strerror or exc})") from None

    def poll(self) -> list[tuple]:
        """The replies that have arrived, without waiting; WriterGone once it has ended
        and every reply it sent is taken."""
        while not self._ended:
            try:
                data = os.read(self._replies, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._ended = True
                break
            self._buffer += data
            if len(data) < _READ_SIZE:
                break
        messages = []
        while len(self._buffer) >= 4:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < 4 + size:
                break
            messages.append(pickle.loads(self._buffer[4:4 + size]))
            self._buffer = self._buffer[4 + size:]
        if not messages and self._ended:
            raise WriterGone("the lease writer process ended")
        return messages

    def spin(self, seconds: float) -> list[tuple]:
        """poll() until a reply comes, at most `seconds` (the caller had nothing better to do)."""
        deadline = time.monotonic() + seconds
        while not (messages := self.poll()) and time.monotonic() < deadline:
            pass
        return messages

    def wait(self, timeout: float | None) -> tuple | None:
        """The next reply, waiting at most `timeout` (None: for ever); None when none came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        held: list[tuple] = []
        while True:
            held = self.poll()
            if held:
                if len(held) > 1:  # one request is in flight at a time: never more than one reply
                    raise WriterGone(f"the lease writer process sent {len(held)} replies to one request")
                return held[0]
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            _wait_readable(self._replies, left)

    def stop(self, timeout: float) -> bool:
        """Ask it to checkpoint, close the database and end; True when it did within
        `timeout` seconds. A process still writing (a hung disk) is left to end on its
        own once its write returns: it is not killed under the write."""
        closed = False
        try:
            self.send((CLOSE,))
            reply = self.wait(timeout)
            closed = reply is not None and reply[0] == CLOSE
        except WriterGone:
            pass
        self._close_pipes()
        self.reap(timeout=1.0 if closed else 0.0)
        return closed

    def kill(self) -> None:
        if self.exit is None:  # once reaped, the pid may be another process's
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._close_pipes()
        self.reap(timeout=1.0)

    def reap(self, timeout: float) -> str | None:
        """How it ended ('exit status N', 'killed by signal N'), waiting at most `timeout`
        for it; None while it still runs."""
        deadline = time.monotonic() + timeout
        while self.exit is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (by whoever waits for every child)
                self.exit = "ended"
                break
            if pid:
                code = os.waitstatus_to_exitcode(status)
                self.exit = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        return self.exit

    def _close_pipes(self) -> None:
        for fd in (self._requests, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        self._requests = self._replies = -1
        self._ended = True


def _wait_readable(fd: int, seconds: float | None) -> None:
    """Until `fd` is readable (or has hung up), at most `seconds`. poll, not select: a
    daemon holding many descriptors gets pipes numbered past select's 1024."""
    waiter = select.poll()
    waiter.register(fd, select.POLLIN)
    waiter.poll(None if seconds is None else max(0, int(seconds * 1000) + 1))


def _frame(message: tuple) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _FRAME.pack(len(data)) + data


# -- the child ----------------------------------------------------------------------------
def _child(requests: int, replies: int, open_connection: Callable[[], sqlite3.Connection]) -> NoReturn:
    """The forked child's whole life; it never returns into the daemon's code."""
    status = 1
    try:
        _detach(requests, replies)
        status = _serve(requests, replies, open_connection)
    finally:
        os._exit(status)


def _detach(requests: int, replies: int) -> None:
    """Let go of everything the daemon holds: every other descriptor (a client's socket
    kept open here would never see its connection end; a lock's descriptor would hold the
    lock past the daemon), its signal handling, and the collector's view of its objects."""
    low, high = sorted((requests, replies))
    os.closerange(3, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from a thread other than the main one: it had none
        pass
    # systemd's stop signals the whole unit: the child ends when the daemon closes its
    # pipe, after the last batch is written, not before.
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    gc.freeze()


def _serve(requests: int, replies: int, open_connection: Callable[[], sqlite3.Connection]) -> int:
    try:
        db = open_connection()
        ready = (READY, lease_commit.last_batch(db))
    except BaseException as exc:  # noqa: BLE001 - told to the daemon, which says it in its own words
        os.write(replies, _frame((FAILED, str(exc) or type(exc).__name__)))
        return 1
    os.write(replies, _frame(ready))
    source = _Requests(requests)
    replied = float("-inf")
    spin = 0.0
    while (message := source.next(spin)) is not None:
        arrived = time.monotonic()
        kind = message[0]
        if kind == BATCH:
            committed, outcomes = lease_commit.write_batch(db, message[1], message[2])
            reply = (BATCH, message[1], committed, outcomes)
        elif kind == CHECKPOINT:
            reply = (CHECKPOINT, lease_commit.checkpoint(db, message[1]))
        else:  # CLOSE: leave a short WAL behind, the next start reads less
            error = lease_commit.checkpoint(db, "TRUNCATE")
            db.close()
            _write_all(replies, _frame((CLOSE, error)))
            return 0
        _write_all(replies, _frame(reply))
        spin = CHILD_SPIN_SECONDS if arrived - replied < CHILD_SPIN_SECONDS else 0.0
        replied = time.monotonic()
    db.close()
    return 0


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except BrokenPipeError:  # the daemon is gone: the next read ends this process
        pass


class _Requests:
    """The child's end of the request pipe, read whole frames at a time."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        os.set_blocking(fd, False)

    def next(self, spin: float) -> tuple | None:
        """The next request (polling for `spin` seconds before it sleeps); None at EOF."""
        deadline = time.monotonic() + spin
        while True:
            if len(self._buffer) >= 4:
                (size,) = _FRAME.unpack_from(self._buffer)
                if len(self._buffer) >= 4 + size:
                    message = pickle.loads(self._buffer[4:4 + size])
                    self._buffer = self._buffer[4 + size:]
                    return message
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    _wait_readable(self._fd, None)
                continue
            if not data:
                return None
            self._buffer += data
