"""The systemd tier's session fixture (see tier.py); skipped unless TOPOD_SYSTEMD_TIER=1."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tier import CONFIG, DROPIN, DROPIN_TEXT, ENABLED, FIXTURE, REPO, Container


def pytest_collection_modifyitems(config, items):
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="the systemd tier runs under `sudo make test-systemd` (TOPOD_SYSTEMD_TIER=1)")
    for item in items:
        if "tests/systemd/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tier(tmp_path_factory):
    """The booted container with topod installed and enabled (the README's steps)."""
    if os.geteuid() != 0 or not shutil.which("systemd-nspawn"):
        pytest.skip("needs root and systemd-nspawn (run: sudo make test-systemd)")
    rootfs = Path(os.environ.get("TOPOD_TIER_ROOTFS", REPO / "build/systemd-rootfs"))
    wheelhouse = Path(os.environ.get("TOPOD_TIER_WHEELHOUSE", REPO / "build/systemd-wheelhouse"))
    if not (rootfs / ".topod-stamp").is_file() or not list(wheelhouse.glob("topod-*.whl")):
        pytest.skip("no rootfs or wheelhouse: run `make test-systemd` (scripts/systemd-tier.sh prepares them)")
    timings: dict[str, float] = {}
    started = time.monotonic()
    work = REPO / "build/systemd-run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = work / "root"
    subprocess.run(["cp", "-a", "--reflink=auto", str(rootfs), str(root)], check=True)
    timings["copy rootfs"] = time.monotonic() - started

    # The host root topod serves: a built fixture (8 H800s), never this machine's /sys or
    # /proc. It carries the container's own marker, as a tree captured in here would.
    from topod.hostspec import build_host, load_builtin_spec

    fixture = root / FIXTURE.lstrip("/")
    build_host(load_builtin_spec("h800-8gpu"), fixture)
    (fixture / "run/systemd").mkdir(parents=True, exist_ok=True)
    (fixture / "run/systemd/container").write_text("systemd-nspawn\n")
    # Every IRQ on CPU 0: a plan moves many of them, so a daemon that wrote would show.
    for affinity in (fixture / "proc/irq").glob("*/smp_affinity_list"):
        affinity.write_text("0\n")

    container = Container(root, work / "nspawn.log", {"/src": REPO, "/wheelhouse": wheelhouse})
    container.boot()
    timings["boot"] = container.boot_seconds
    try:
        mark = time.monotonic()
        # docs/operations.md, "Install": the offline install, then the system steps it prints.
        install = container.sh("make --no-print-directory -C /src install WHEELHOUSE=/wheelhouse", timeout=300)
        assert install.returncode == 0, f"make install failed:\n{install.stdout}\n{install.stderr}"
        timings["make install"] = time.monotonic() - mark
        # The packaged config, serving the fixture, with an IRQ cycle every second.
        container.sh(f"sed -i 's|^root = \"/\"|root = \"{FIXTURE}\"|; s|^interval_seconds = 10.0|interval_seconds = 1.0|'"
                     f" {CONFIG} && grep -q '^root = \"{FIXTURE}\"' {CONFIG} && grep -q '^interval_seconds = 1.0' {CONFIG}",
                     check=True)
        container.sh(f"mkdir -p {os.path.dirname(DROPIN)} && cat > {DROPIN} <<'EOF'\n{DROPIN_TEXT}EOF", check=True)
        mark = time.monotonic()
        container.enable = container.sh(
            "systemd-sysusers && systemd-tmpfiles --create && systemctl daemon-reload"
            " && systemctl enable --now topod.socket topod.service", timeout=120)
        timings["enable --now"] = time.monotonic() - mark
        # A member of group topod (made by sysusers above) and a user outside it.
        container.sh("useradd -m -G topod alice && useradd -m bob", check=True)
        container.install_output = install.stdout
        container.timings = timings
        yield container
    finally:
        try:
            log = container.sh("journalctl -u topod.service -u topod.socket --no-pager -o short-monotonic")
            (work / "journal.txt").write_text(log.stdout)
        except Exception:  # noqa: BLE001 - a container that died has no journal to save
            pass
        if os.environ.get("TOPOD_TIER_KEEP") == "1":
            print(f"\nkept the container: nsenter -t {container.pid} -a /bin/bash ; then kill {container.process.pid}")
        else:
            container.poweroff()
        timings["total"] = time.monotonic() - started
        line = "systemd tier: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
        (work / "timings.txt").write_text(line + "\n")
