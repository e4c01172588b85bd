"""topoctl run --journal's stream to journald (topod.journalstream): the header journald
reads, the output after it, and a clear error where nothing listens. journald itself is
in the systemd tier (tests/systemd/test_scope_api.py: journalctl -u the lease's scope)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from topod import journalstream


def test_header_is_the_seven_lines_journald_reads():
    assert journalstream.header("train", "topod-lease-ab.scope", 6) == b"train\ntopod-lease-ab.scope\n6\n0\n0\n0\n0\n"
    with pytest.raises(ValueError):
        journalstream.header("a\nb", "", 6)


def _listener(path: str, streams: list[bytes], count: int) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def accept() -> None:
        for _ in range(count):
            conn, _ = server.accept()
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            streams.append(data)
            conn.close()
        server.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return thread


def test_a_process_redirected_writes_stdout_and_stderr_as_two_streams(tmp_path):
    path = str(tmp_path / "stdout")
    streams: list[bytes] = []
    thread = _listener(path, streams, 2)
    script = ("import sys; from topod import journalstream; "
              f"journalstream.redirect('job-7', 'topod-lease-x.scope', {path!r}); "
              "print('hello out', flush=True); print('oops', file=sys.stderr, flush=True)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))
    thread.join(timeout=10)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done
    assert sorted(streams) == sorted([b"job-7\ntopod-lease-x.scope\n6\n0\n0\n0\n0\nhello out\n",
                                      b"job-7\ntopod-lease-x.scope\n3\n0\n0\n0\n0\noops\n"])


def test_no_journald_is_a_clear_error(tmp_path):
    with pytest.raises(journalstream.NoJournalError) as caught:
        journalstream.check(str(tmp_path / "none"))
    assert "no journald stream socket" in str(caught.value) and "systemd-journald" in str(caught.value)
