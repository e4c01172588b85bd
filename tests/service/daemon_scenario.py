"""A daemon scenario: the daemon as users start it (its own defaults plus only --root,
--socket, --state-dir on a fixture tree, or a given config), with a stand-in for
systemd's notify socket and watchdog, driven step by step; check() holds the invariants
after every step: no unhandled exception in the log, no lease lost, no GPU in two
leases, health answers, the watchdog keeps pinging, /metrics answers (and lints).
A test module takes it as a fixture: `yield from scenarios(daemon_factory, tmp_path)`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path


WATCHDOG_USEC = 1_000_000  # pings every 0.5 s


LINK_TABLES = Path(__file__).resolve().parents[1] / "fixtures" / "links"


PROMTOOL = shutil.which("promtool")


def live_profile(table: Path = LINK_TABLES / "pcie-8gpu-uplink-degrades.json") -> str:
    """What defaults on for `/`, on a fixture root: link probing (the simulated backend
    stands in for host memory copies, which would measure this machine), IRQ balancing
    in the daemon's default mode through its worker process."""
    return (f'[probe]\nbackend = "simulated"\nsimulated_table = "{table}"\n'
            "min_interval_seconds = 1.0\nmax_interval_seconds = 5.0\n")


def scrape_metrics(socket_path: str) -> tuple[int, str]:
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.connect(socket_path)
    raw.sendall(b"GET /metrics HTTP/1.1\r\nHost: topod\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := raw.recv(65536):
        data += chunk
    raw.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def check_metrics(socket_path: str) -> str:
    """GET /metrics answers 200 and, where promtool is installed, passes its lint."""
    status, text = scrape_metrics(socket_path)
    assert status == 200, text[-2000:]
    assert "topod_build_info" in text
    if PROMTOOL:
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    return text


class NotifyListener:
    """A stand-in for systemd's notify socket: collects the daemon's datagrams."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, OSError):
                continue
            self.messages.append((time.monotonic(), data.decode("utf-8", "replace")))

    def pings_since(self, since: float) -> int:
        return sum(1 for at, text in self.messages if at >= since and "WATCHDOG=1" in text.split("\n"))

    def statuses(self) -> list[str]:
        return [line[len("STATUS="):] for _, text in self.messages for line in text.split("\n")
                if line.startswith("STATUS=")]

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


def _wait_until(predicate, timeout: float = 10.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


class Scenario:
    def __init__(self, daemon_factory, tmp_path: Path, host: str = "h800-8gpu", config: str | None = None) -> None:
        self.notify = NotifyListener(tmp_path / "notify.sock")
        self.daemon = daemon_factory(host, config=config, env={"NOTIFY_SOCKET": self.notify.path,
                                                              "WATCHDOG_USEC": str(WATCHDOG_USEC)})
        self.client = self.daemon.start()
        self.granted: dict[str, list[int]] = {}

    def allocate(self, gpus: int, **fields) -> dict:
        lease = self.client.allocate(gpus, **fields)
        self.granted[lease["id"]] = lease["gpus"]
        return lease

    def release(self, lease_id: str) -> None:
        self.client.release(lease_id)
        self.granted.pop(lease_id, None)

    def check(self, *, expect_degraded: bool = False) -> dict:
        health = self.client.health()
        assert health["gpus_free"] >= 0 and health["gpus_free"] <= health["gpus"]
        leases = self.client.leases()
        by_id = {lease["id"]: lease for lease in leases}
        assert set(self.granted) <= set(by_id), f"lease lost: {set(self.granted) - set(by_id)}"
        held = [gpu for lease in leases for gpu in lease["gpus"]]
        assert len(held) == len(set(held)), f"a GPU in two leases: {held}"
        log = self.daemon.log()
        assert "Traceback (most recent call last)" not in log, log[-3000:]
        assert "Task exception was never retrieved" not in log
        since = time.monotonic()
        assert _wait_until(lambda: self.notify.pings_since(since) >= 1, timeout=5), "the watchdog stopped pinging"
        if not expect_degraded:
            assert health["status"] == "ok", health
        check_metrics(self.daemon.socket)
        return health

    def close(self) -> None:
        self.daemon.stop()
        self.notify.close()


def scenarios(daemon_factory, tmp_path: Path):
    """The body of a `scenario` fixture: make(**options) starts a Scenario; each is closed
    when the test ends."""
    made: list[Scenario] = []

    def make(**options) -> Scenario:
        made.append(Scenario(daemon_factory, tmp_path, **options))
        return made[-1]

    yield make
    for item in made:
        item.close()
