"""The live tier's session: one QEMU guest booted for the whole run (guest.py), topod
installed in it offline from the wheelhouse as README says, its units enabled.

Runs only under `make test-live` (scripts/live-tier.sh sets TOPOD_LIVE_TIER=1 after
building the guest image and the wheelhouse); elsewhere these files are not even
collected, so `make test` and a bare `pytest` never boot anything."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

ENABLED = os.environ.get("TOPOD_LIVE_TIER") == "1"
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build/live-run"
CONFIG = "/etc/topod/topod.toml"
SOURCE = "/mnt/topod"  # the source tree and the wheelhouse, on their own read-only disk
BEFORE = "/root/affinity-before-topod.txt"  # every IRQ's affinity before topod started


@pytest.fixture(scope="session")
def guest():
    """The booted guest with topod installed and enabled (the README's steps)."""
    from guest import Guest, make_disk, stage_source

    if os.geteuid() != 0 or not shutil.which("qemu-system-x86_64"):
        pytest.skip("needs root and qemu-system-x86_64 (run: sudo make test-live)")
    image = Path(os.environ.get("TOPOD_LIVE_IMAGE", REPO / "build/live-image"))
    wheelhouse = Path(os.environ.get("TOPOD_LIVE_WHEELHOUSE", REPO / "build/live-wheelhouse"))
    if not (image / "stamp").is_file() or not list(wheelhouse.glob("topod-*.whl")):
        pytest.skip("no guest image or wheelhouse: run `make test-live` (scripts/live-tier.sh prepares them)")
    if os.environ.get("TOPOD_LIVE_ATTACH") == "1":
        yield _attached(image)  # a guest kept by TOPOD_LIVE_KEEP=1, for working on the tests
        return
    timings: dict[str, float] = {}
    started = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    stage = WORK / "stage"
    stage_source(REPO, wheelhouse, stage)
    make_disk(stage, WORK / "src.img", "topod-src")
    shutil.rmtree(stage)
    timings["source disk"] = time.monotonic() - started

    machine = Guest(image, WORK, WORK / "src.img")
    try:
        timings["boot to agent"] = machine.boot()
        mark = time.monotonic()
        state = machine.wait_booted()
        timings["boot to systemd verdict"] = time.monotonic() - mark
        assert state in ("running", "degraded"), f"the guest booted to {state!r}:\n" \
            + machine.sh("systemctl --failed --no-pager").stdout
        machine.sh(f"mkdir -p {SOURCE} && mount -o ro LABEL=topod-src {SOURCE}", check=True)
        # What every IRQ's affinity was before topod ran: what it must leave alone stays so.
        machine.sh(f"{AFFINITIES} > {BEFORE}", check=True)
        machine.affinity_before = affinities(machine)

        mark = time.monotonic()
        install = machine.sh(f"make --no-print-directory -C {SOURCE}/src install WHEELHOUSE={SOURCE}/wheelhouse",
                             timeout=1500)
        assert install.returncode == 0, f"make install failed:\n{install.stdout}\n{install.stderr}"
        timings["make install"] = time.monotonic() - mark
        machine.install_output = install.stdout
        # The packaged config as installed: IRQ mode continuous, every other key its default.
        machine.sh(f"grep -q '^mode = \"continuous\"' {CONFIG}", check=True)
        mark = time.monotonic()
        machine.enable = machine.sh("systemd-sysusers && systemd-tmpfiles --create && systemctl daemon-reload"
                                    " && systemctl enable --now topod.socket topod.service", timeout=600)
        assert machine.enable.returncode == 0, machine.enable.stdout + machine.enable.stderr
        machine.wait_until(lambda: irq_report(machine).get("cycles", 0) >= 1, "topod's first IRQ cycle", 600, 3)
        timings["enable --now to first cycle"] = time.monotonic() - mark
        machine.timings = timings
        yield machine
    finally:
        try:
            if machine.alive():
                log = machine.sh("journalctl -u topod.service -u topod.socket --no-pager -o short-monotonic", timeout=120)
                (WORK / "journal.txt").write_text(log.stdout)
                (WORK / "interrupts.txt").write_text(machine.sh("cat /proc/interrupts", timeout=60).stdout)
        except Exception:  # noqa: BLE001 - a guest that died has no journal to save
            pass
        if os.environ.get("TOPOD_LIVE_KEEP") == "1" and machine.alive():
            print(f"\nkept the guest: QMP {machine.qmp_path}, agent {machine.qga_path}; then kill {machine.process.pid}")
        else:
            machine.shutdown()
        timings["total"] = time.monotonic() - started
        line = "live tier: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
        (WORK / "timings.txt").write_text(line + "\n")


def _attached(image: Path):
    """The guest a run kept (TOPOD_LIVE_KEEP=1), already set up: nothing booted or installed."""
    from guest import Guest

    machine = Guest(image, WORK, WORK / "src.img")
    machine.attached = True
    machine.wait_agent(60)
    machine.affinity_before = parse_affinities(machine.sh(f"cat {BEFORE}", check=True).stdout)
    return machine


from livetier import AFFINITIES, affinities, irq_report, parse_affinities  # noqa: E402 - after collect_ignore
