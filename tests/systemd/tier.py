"""The systemd tier's container: a fresh copy of the cached Debian 12 rootfs booted with
`systemd-nspawn -b` (Debian's systemd 252 as its PID 1), topod installed in it offline
from the wheelhouse as README says, and enabled with a fixture host root.

Runs only under `make test-systemd` (TOPOD_SYSTEMD_TIER=1, set by scripts/systemd-tier.sh,
which also builds the rootfs and the wheelhouse); skipped otherwise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENABLED = os.environ.get("TOPOD_SYSTEMD_TIER") == "1"
FIXTURE = "/srv/topod-fixture/h800-8gpu"  # the daemon's [daemon] root inside the container
CONFIG = "/etc/topod/topod.toml"
DROPIN = "/etc/systemd/system/topod.service.d/tier.conf"
WATCHDOG_SEC = 6
# The tier's drop-in. ReadOnlyPaths=/proc/irq: ProtectControlGroups=yes gives the service
# a fresh /proc without nspawn's read-only cover of /proc/irq (GUIDE, issue 23), and this
# is the host's /proc/irq: the unit must never let it be written from here.
# ReadWritePaths= on the fixture's IRQ files: were the daemon's own container guard to
# fail, its writes would land there (and show), never on a real /proc/irq.
DROPIN_TEXT = f"""[Service]
ReadOnlyPaths=/proc/irq
ReadWritePaths={FIXTURE}/proc/irq
WatchdogSec={WATCHDOG_SEC}
"""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Container:
    """One booted container; `sh` runs a command inside it as root (or as `user`)."""

    def __init__(self, root: Path, log: Path, binds: dict[str, Path]) -> None:
        self.root, self.log, self.binds = root, log, binds
        self.process: subprocess.Popen | None = None
        self.pid = 0
        self.boot_seconds = 0.0

    def boot(self, timeout: float = 120) -> None:
        started = time.monotonic()
        command = ["systemd-nspawn", "-b", "-D", str(self.root), "--register=no", "--keep-unit",
                   "-M", "topod-tier", "--console=passive",
                   # Only loopback: the install below cannot reach PyPI even if it tried.
                   "--private-network"]
        command += [f"--bind-ro={source}:{target}" for target, source in self.binds.items()]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not self.pid:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"systemd-nspawn did not start a container:\n{self.log.read_text()[-3000:]}")
            self.pid = self._init_pid()
            time.sleep(0.1)
        # The init pid exists before its systemd listens: until then systemctl cannot connect.
        while True:
            result = self.sh("systemctl is-system-running --wait", timeout=timeout)
            state = result.stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.monotonic() > deadline or state not in ("", "offline", "initializing", "starting"):
                raise RuntimeError(f"container booted to {state!r} ({result.stderr.strip()}):\n"
                                   f"{self.sh('systemctl --failed').stdout}")
            time.sleep(0.2)
        self.boot_seconds = time.monotonic() - started

    def _init_pid(self) -> int:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        for pid in children.read_text().split():
            status = Path(f"/proc/{pid}/status").read_text()
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()
            if len(nspid) > 2 and nspid[-1] == "1":
                return int(pid)
        return 0

    def sh(self, script: str, user: str | None = None, timeout: float = 120,
           check: bool = False) -> subprocess.CompletedProcess[str]:
        inner = ["runuser", "-u", user, "--", "/bin/sh", "-c", script] if user else ["/bin/sh", "-c", script]
        result = subprocess.run(["nsenter", "-t", str(self.pid), "-a", "env", "-i", f"PATH={PATH}", "LANG=C.UTF-8",
                                 *inner], capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{script!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def poweroff(self, timeout: float = 60) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.pid:
            self.sh("systemctl poweroff --no-block")
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGKILL to the container's init ends its whole pid namespace; killing only
            # systemd-nspawn would leave the container running without it.
            if self.pid:
                os.kill(self.pid, signal.SIGKILL)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.pid = 0

    # --- topod in the container -------------------------------------------------------
    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props), check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def leases(self) -> list[dict]:
        listed = json.loads(self.sh("topoctl --json leases", check=True).stdout)
        return listed["leases"] if isinstance(listed, dict) else listed

    def wait_until(self, predicate, what: str, timeout: float = 60, interval: float = 0.3):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        raise AssertionError(f"not within {timeout}s: {what}")

    def journal(self, *matches: str, since: int = 0) -> list[dict]:
        """Journal entries with these field matches, written after `since` (see now_usec).
        Filtered here: systemd 252's --after-cursor together with a match returns nothing."""
        out = self.sh("journalctl -o json --no-pager " + " ".join(matches)).stdout
        entries = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
        return [e for e in entries if int(e["__REALTIME_TIMESTAMP"]) > since]

    def now_usec(self) -> int:
        return int(self.sh("date +%s%6N", check=True).stdout)
