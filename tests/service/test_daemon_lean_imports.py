"""The idle daemon leaves out what it never uses (issue 26): rich (structlog's console
tracebacks), ssl and hashlib's OpenSSL backend (no TLS is served) and frozenlist's C++
extension (libstdc++) are not loaded by the daemon started as a user starts it, nor is the
system's MIME database read; the metrics endpoint, whose library needs ssl, still answers,
loading it then. Checked on the daemon's own -X importtime list (PYTHONPROFILEIMPORTTIME)
and its memory map, not on a copy of its start-up."""

from __future__ import annotations

import re
from pathlib import Path

from tests.service.daemon_scenario import scrape_metrics

# A module marked absent still shows in the -X importtime list (the attempt); what only
# its loading imports does not: rich's submodules, ssl's C part.
NOT_IMPORTED = ("rich.console", "rich.traceback", "_ssl")


def _imported(log: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in log.splitlines() if line.startswith("import time:")}


def _maps(pid: int, pattern: str) -> bool:
    return bool(re.search(pattern, Path(f"/proc/{pid}/maps").read_text()))


def test_the_idle_daemon_loads_neither_rich_nor_ssl_and_metrics_still_answer(daemon_factory):
    daemon = daemon_factory(config=None, env={"PYTHONPROFILEIMPORTTIME": "1"})
    client = daemon.start()
    assert client.health()["status"] in ("ok", "degraded")
    imported = _imported(daemon.log())
    assert "aiohttp.web" in imported and "structlog" in imported, "the daemon's stack loaded"
    assert sorted(imported & set(NOT_IMPORTED)) == []
    assert not _maps(daemon.process.pid, r"/libssl\.so|/libcrypto\.so|/_ssl\.cpython|/_hashlib\.cpython")
    assert not _maps(daemon.process.pid, r"/libstdc\+\+\.so"), "frozenlist's C++ extension"
    status, text = scrape_metrics(daemon.socket)  # prometheus_client imports ssl: given it now
    assert status == 200 and "topod_" in text, text[-2000:]
    assert _maps(daemon.process.pid, r"/libssl\.so")


def test_the_daemons_start_reads_no_mime_database_and_puts_the_list_back(tmp_path):
    # aiohttp builds its file-response type table at import; the daemon serves no files.
    # _import_lean is what topod's main() runs at start; a fresh interpreter, as there.
    import json
    import subprocess
    import sys

    database = tmp_path / "mime.types"
    database.write_text("application/x-topod-test\ttopodtest\n")
    probe = (
        "import json, mimetypes, sys\n"
        f"mimetypes.knownfiles = [{str(database)!r}]\n"
        "from topod.service.main import _import_lean\n"
        "_import_lean()\n"
        "print(json.dumps([mimetypes.inited, mimetypes.guess_type('x.topodtest')[0], mimetypes.knownfiles,\n"
        "                  'aiohttp.web' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    inited, guessed, known, aiohttp_loaded = json.loads(out.stdout)
    assert aiohttp_loaded and inited, "aiohttp loaded and its table built"
    assert guessed is None, "the MIME database was read"
    assert known == [str(database)], "knownfiles put back for anyone who calls init() again"
