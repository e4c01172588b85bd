"""The IRQ worker process starts from a lean import set (issue 26): the IRQ pipeline and
the module that names what it pickles, not the daemon's asyncio, structlog or HTTP stack
(which cost it ~10 MiB of PSS). Run as the daemon runs it (irq_worker.WORKER_ARGS), sent
its start frame, then stopped by closing its stdin."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from topod.config import load_config
from topod.service.irq_worker import FRAME, WORKER_ARGS

REPO = Path(__file__).resolve().parents[2]
DAEMON_ONLY = ("asyncio", "structlog", "rich", "aiohttp", "sqlite3", "topod.alloc", "topod.api")
# dataclasses' compile-at-import machinery (inspect and what it loads, ~1.5 MiB): the
# pipeline's value classes are topod.record records (issue 26); typing (~0.5 MiB): its
# named tuples come from collections, its annotations are strings; runpy and
# importlib.util (~0.7 MiB): what `python -m` loads before the module
NOT_NEEDED = ("dataclasses", "inspect", "ast", "dis", "tokenize", "ssl", "_hashlib", "json", "argparse", "typing",
              "runpy", "importlib.util")


def _run_worker(root: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    start = pickle.dumps((str(root), load_config(None).section("irq")), protocol=pickle.HIGHEST_PROTOCOL)
    return subprocess.run([sys.executable, "-X", "importtime", *WORKER_ARGS], input=FRAME.pack(len(start)) + start,
                          capture_output=True, timeout=60, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_the_irq_worker_imports_neither_asyncio_nor_structlog_nor_the_api(host_tree):
    done = _run_worker(host_tree("h800-8gpu"))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert "topod.irq.cycle" in imported, "the worker built its balancer"
    heavy = sorted(name for name in imported if name.split(".")[0] in DAEMON_ONLY or name.startswith(DAEMON_ONLY))
    assert heavy == [], f"the IRQ worker imported the daemon's modules: {heavy}"
    extra = sorted(imported & set(NOT_NEEDED))
    assert extra == [], f"the IRQ worker imported modules it does not need: {extra}"


def test_a_topod_package_in_the_working_directory_is_not_what_the_worker_runs(host_tree, tmp_path):
    """A daemon started by hand in a directory that holds a `topod` package: its IRQ worker
    still runs the installed topod (the working directory is not put on sys.path)."""
    planted = tmp_path / "topod"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise SystemExit('the planted topod package ran')\n")
    done = _run_worker(host_tree("h800-8gpu"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"planted" not in done.stderr
    assert any(line.endswith(b"topod.irq.cycle") for line in done.stderr.splitlines()), "the real worker ran"
