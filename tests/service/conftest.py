"""Run the real daemon on a temporary socket against a fixture host; or its lease service
alone, in-process (`service`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from topod.client import ApiError, Client
from topod.config import load_config
from topod.discover.scan import discover
from topod.events import EventBus
from topod.host import HostRoot
from topod.service.lease_store import LeaseStore
from topod.service.leases import LeaseService
from topod.service.state import HostState

REPO = Path(__file__).resolve().parents[2]


class DaemonProcess:
    """config: TOML text for --config ("" = IRQ dry-run, no probes); None = started as a
    user starts it: the daemon's own defaults and only --root, --socket, --state-dir."""

    def __init__(self, root: Path, workdir: Path, config: str | None = "", env: dict | None = None) -> None:
        self.root = root
        self.workdir = workdir
        self.socket = str(workdir / "topod.sock")
        self.state = str(workdir / "state")
        self.config_path = workdir / "topod.toml"
        self.use_config = config is not None
        if config is not None:
            self.config_path.write_text(config or '[irq]\nmode = "dry-run"\n[probe]\nenabled = false\n')
        self.log_path = workdir / "daemon.log"
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> Client:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop("NOTIFY_SOCKET", None)
        env.update(self.extra_env)
        log = open(self.log_path, "ab")
        command = [sys.executable, "-m", "topod.service.main", "--root", str(self.root), "--socket", self.socket,
                   "--state-dir", self.state]
        if self.use_config:
            command += ["--config", str(self.config_path), "--log-format", "json"]
        self.process = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        client = Client(self.socket, timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited {self.process.returncode}: {self.log_path.read_text()[-3000:]}")
            try:
                client.health()
                return client
            except ApiError:
                time.sleep(0.05)
        raise RuntimeError(f"daemon did not start: {self.log_path.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture()
def daemon_factory(host_tree, tmp_path):
    started: list[DaemonProcess] = []

    def make(host: str = "h800-8gpu", config: str | None = "", env: dict | None = None,
             root: Path | None = None) -> DaemonProcess:
        work = tmp_path / f"d{len(started)}"
        work.mkdir()
        proc = DaemonProcess(root if root is not None else host_tree(host), work, config, env)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.stop(signal.SIGKILL)


@pytest.fixture()
def public_socket():
    """Put a daemon's socket where other users may reach it: pytest's own tmp dirs are 0700,
    so a socket test that drops to another uid needs a 0755 directory; removed afterwards."""
    made: list[str] = []

    def place(daemon: DaemonProcess) -> str:
        public = tempfile.mkdtemp(prefix="topod-public-")
        made.append(public)
        os.chmod(public, 0o755)
        daemon.socket = os.path.join(public, "topod.sock")
        return daemon.socket

    yield place
    for public in made:
        shutil.rmtree(public, ignore_errors=True)


@pytest.fixture()
def systemd(tmp_path):
    """A real D-Bus bus with a stand-in for systemd's Manager on it (fake_systemd.py);
    skipped where no dbus-daemon can run."""
    from fake_systemd import FakeSystemd

    try:
        fake = FakeSystemd(tmp_path)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield fake
    fake.close()


@pytest.fixture()
def service(host_tree, tmp_path):
    """The real LeaseService on its real LeaseStore, in-process, for the h800 fixture host
    (8 GPUs) with the default [alloc] settings."""
    topology = discover(HostRoot(host_tree("h800-8gpu")), live_nvml=False)
    store = LeaseStore(tmp_path / "state")
    alloc = LeaseService(HostState(topology), store, EventBus(), dict(load_config(None).section("alloc")), set())
    yield alloc
    store.close()
