"""Run topod's udev code against a umockdev testbed, for real.

UMockdev.Testbed needs libumockdev-preload in LD_PRELOAD and the GObject bindings (gi),
which exist for Debian's /usr/bin/python3, not for the venv's interpreter. So the pytest
side (run_scenarios) starts a child: `umockdev-wrapper <python with gi> this_file TREE
SCENARIO...` with the repo and pyudev on PYTHONPATH. The child (main) loads the host
tree's PCI functions into a testbed the way umockdev-record would capture them, runs
each scenario in a fresh testbed and prints one JSON object: scenario -> result.
Under the preload, /sys of the child *is* the testbed, so HostRoot('/') and libudev
both read it, exactly as on a live host.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import traceback
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import sys, gi; gi.require_version('UMockdev', '1.0'); "
         "from gi.repository import UMockdev; assert sys.version_info >= (3, 11)")
PACKAGES = "umockdev gir1.2-umockdev-1.0 python3-gi"


class UmockdevUnavailable(RuntimeError):
    pass


# ------------------------------------------------------------ pytest side


@cache
def umockdev_python() -> str:
    """An interpreter (>= 3.11) that can import gi's UMockdev: $TOPOD_UMOCKDEV_PYTHON,
    this one, or Debian's /usr/bin/python3. Raises UmockdevUnavailable saying why not."""
    if shutil.which("umockdev-wrapper") is None:
        raise UmockdevUnavailable(f"umockdev-wrapper not on PATH; apt-get install {PACKAGES}")
    candidates = [os.environ.get("TOPOD_UMOCKDEV_PYTHON"), sys.executable, "/usr/bin/python3"]
    errors = []
    for python in dict.fromkeys(c for c in candidates if c):
        probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return python
        errors.append(f"{python}: {probe.stderr.strip().splitlines()[-1:] or probe.returncode}")
    raise UmockdevUnavailable(f"no Python >= 3.11 with gi + UMockdev ({'; '.join(map(str, errors))}); "
                              f"apt-get install {PACKAGES}")


def child_pythonpath(python: str, shim_dir: Path) -> str:
    """The repo, plus this interpreter's pyudev (pure Python) when the child lacks one."""
    paths = [str(REPO)]
    has_pyudev = subprocess.run([python, "-c", "import pyudev"], capture_output=True).returncode == 0
    if not has_pyudev:
        spec = importlib.util.find_spec("pyudev")
        if spec is None or not spec.submodule_search_locations:
            raise UmockdevUnavailable("pyudev is installed neither here nor for " + python)
        shim_dir.mkdir(parents=True, exist_ok=True)
        link = shim_dir / "pyudev"
        if not link.exists():
            link.symlink_to(list(spec.submodule_search_locations)[0], target_is_directory=True)
        paths.append(str(shim_dir))
    # The daemon scenario needs topod's own dependencies (aiohttp, structlog, psutil):
    # this interpreter's site-packages, same CPython minor version, go last.
    import sysconfig

    paths.append(sysconfig.get_paths()["purelib"])
    return os.pathsep.join(paths)


def run_scenarios(tree: Path, scenarios: list[str], work: Path, timeout: float = 60) -> dict[str, dict]:
    python = umockdev_python()
    env = dict(os.environ, PYTHONPATH=child_pythonpath(python, work / "shim"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("UMOCKDEV_DIR", None)
    command = ["umockdev-wrapper", python, str(Path(__file__).resolve()), str(tree), *scenarios]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
    if done.returncode != 0 or not done.stdout.strip():
        raise AssertionError(f"umockdev child failed (rc {done.returncode}): {' '.join(command)}\n"
                             f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------ child side: tree -> testbed


def _attributes(directory: Path, prefix: str = "") -> list[tuple[str, str]]:
    found = []
    for entry in sorted(directory.iterdir()):
        if entry.is_symlink() or entry.name == "uevent":
            continue
        if entry.is_file():
            found.append((prefix + entry.name, entry.read_text().rstrip("\n")))
        elif entry.is_dir() and entry.name == "msi_irqs":
            found.extend(_attributes(entry, prefix + entry.name + "/"))
    return found


def device_record(tree: Path, real: Path, subsystem: str, extra: dict[str, str]) -> str:
    """One device in umockdev-record's format (P:/E:/A:/L: lines)."""
    lines = [f"P: /{real.relative_to(tree / 'sys')}", f"E: SUBSYSTEM={subsystem}"]
    lines += [f"E: {key}={value}" for key, value in extra.items()]
    lines += [f"A: {name}={value}" for name, value in _attributes(real)]
    if (real / "driver").is_symlink():
        lines.append(f"L: driver={os.readlink(real / 'driver')}")
    return "\n".join(lines) + "\n"


def tree_records(tree: Path) -> list[str]:
    """Every PCI function of a built host tree and its net/infiniband/nvme/drm children,
    parents before children."""
    from topod.discover.pci import CHILD_NAME_DIRS

    bus = tree / "sys/bus/pci/devices"
    functions = sorted((entry.resolve() for entry in bus.iterdir()), key=lambda p: (len(p.parts), str(p)))
    records = []
    for real in functions:
        extra = {"PCI_SLOT_NAME": real.name}
        if (real / "driver").is_symlink():
            extra["DRIVER"] = os.readlink(real / "driver").rsplit("/", 1)[-1]
        records.append(device_record(tree, real, "pci", extra))
        for cls in CHILD_NAME_DIRS:
            for child in sorted((real / cls).iterdir()) if (real / cls).is_dir() else []:
                key = "INTERFACE" if cls == "net" else "NAME"
                records.append(device_record(tree, child, cls, {key: child.name}))
    return records


def new_testbed(tree: Path):
    import gi

    gi.require_version("UMockdev", "1.0")
    from gi.repository import UMockdev

    testbed = UMockdev.Testbed.new()
    # CPUs and NUMA nodes are plain sysfs files to discovery; udev ignores them.
    shutil.copytree(tree / "sys/devices/system", Path(testbed.get_sys_dir()) / "devices/system", symlinks=True)
    for record in tree_records(tree):
        testbed.add_from_string(record)
    return testbed


def function_record(path: str, vendor: int, device: int, class_code: int, driver: str) -> str:
    """A hot-plugged PCI function (sys path without the /sys prefix)."""
    address = path.rsplit("/", 1)[-1]
    return (f"P: {path}\nE: SUBSYSTEM=pci\nE: PCI_SLOT_NAME={address}\nE: DRIVER={driver}\n"
            f"A: vendor=0x{vendor:04x}\nA: device=0x{device:04x}\nA: class=0x{class_code:06x}\n"
            f"A: numa_node=0\nL: driver=../../../../bus/pci/drivers/{driver}\n")


# ------------------------------------------------------------ child side: scenarios


def _events(watcher, wait_s: float = 2.0) -> list[dict]:
    """Events the watcher drains once its socket is readable (umockdev delivers at once)."""
    import select

    from dataclasses import asdict

    select.select([watcher.fileno()], [], [], wait_s)
    return [asdict(event) for event in watcher.drain()]


def _findings(check) -> list[dict]:
    return [w.to_json() for w in check.findings]


def scenario_enumerate(tree: Path, testbed) -> dict:
    from dataclasses import asdict

    from topod.discover.udev_check import enumerate_udev

    return {"devices": [asdict(d) for d in enumerate_udev()]}


def scenario_cross_check_clean(tree: Path, testbed) -> dict:
    from topod.discover import discover
    from topod.discover.udev_check import cross_check
    from topod.host import HostRoot

    host = HostRoot("/")
    topology = discover(host, live_nvml=False)
    check = cross_check(host, topology)
    return {"used": check.used, "status": check.status, "findings": _findings(check),
            "pci_functions": [d.address for d in topology.pci_devices], "live": host.is_live}


def scenario_cross_check_injected(tree: Path, testbed) -> dict:
    """Topology first, then the testbed changes under it, like hardware under a daemon."""
    from topod.discover import discover
    from topod.discover.udev_check import cross_check
    from topod.host import HostRoot

    host = HostRoot("/")
    topology = discover(host, live_nvml=False)
    facts = json.loads((tree / "topod-fixture.json").read_text())["devices"]
    gpu = next(a for a, f in facts.items() if f["kind"] == "gpu")
    nvme = next(a for a, f in facts.items() if f["kind"] == "nvme")
    gpu_path = (Path("/sys/bus/pci/devices") / gpu).resolve()
    nvme_path = str((Path("/sys/bus/pci/devices") / nvme).resolve())
    testbed.set_attribute(str(gpu_path), "numa_node", "1")
    testbed.uevent(nvme_path, "remove")
    testbed.remove_device(nvme_path)
    # A function outside any pciDDDD:BB host bridge: the stale topology lacks it, udev lists it.
    testbed.add_from_string(function_record("/devices/platform/odd/0000:7f:00.0", 0x10DE, 0x2324, 0x030200,
                                            "nvidia"))
    stale = cross_check(host, topology)
    fresh = cross_check(host, discover(host, live_nvml=False))
    return {"gpu": gpu, "nvme": nvme, "stale": _findings(stale), "fresh": _findings(fresh)}


def scenario_hotplug_add(tree: Path, testbed) -> dict:
    """A hot-add seen by drain() (on a fake clock, so quiet-period checks are exact), then
    a four-event burst seen by wait_for_change() on the real clock."""
    import asyncio

    from topod.discover.udev import UdevSettings, UdevWatcher

    now = [1000.0]
    watcher = UdevWatcher(UdevSettings(quiet_s=0.5, max_delay_s=5.0), clock=lambda: now[0])
    parent = "/devices/pci0000:60/0000:60:01.0"
    testbed.add_from_string(function_record(parent, 0x8086, 0x352A, 0x060400, "pcieport"))
    testbed.add_from_string(function_record(f"{parent}/0000:61:00.0", 0x10DE, 0x2330, 0x030200, "nvidia"))
    seen = _events(watcher)
    now[0] += 0.4
    before_quiet = watcher.take_due()
    now[0] += 0.2
    after_quiet = watcher.take_due()

    # Steps 10 ms apart against a 300 ms quiet period: a loaded CI machine may stall a
    # step, but not by 30x; two requests here would mean the debounce failed.
    burst_watcher = UdevWatcher(UdevSettings(quiet_s=0.3, max_delay_s=3.0))
    nic = f"{parent}/0000:61:00.1"
    steps = [
        lambda: testbed.add_from_string(function_record(nic, 0x15B3, 0x1021, 0x020700, "mlx5_core")),
        lambda: testbed.add_from_string(f"P: {nic}/infiniband/mlx5_9\nE: SUBSYSTEM=infiniband\nE: NAME=mlx5_9\n"),
        lambda: testbed.add_from_string(f"P: {nic}/net/ibp97s0f1\nE: SUBSYSTEM=net\nE: INTERFACE=ibp97s0f1\n"),
        lambda: testbed.uevent(f"/sys{nic}", "change"),
    ]

    async def burst() -> tuple[object, object]:
        loop = asyncio.get_running_loop()
        for index, step in enumerate(steps):
            loop.call_later(0.01 * (index + 1), step)
        first = await burst_watcher.wait_for_change(timeout=3.0)
        second = await burst_watcher.wait_for_change(timeout=0.4)
        return first, second

    loop_first, loop_second = asyncio.run(burst())
    return {
        "events": seen,
        "request_before_quiet": before_quiet.to_json() if before_quiet else None,
        "request_after_quiet": after_quiet.to_json() if after_quiet else None,
        "burst_request": loop_first.to_json() if loop_first else None,
        "after_burst": loop_second.to_json() if loop_second else None,
    }


def scenario_hotplug_remove(tree: Path, testbed) -> dict:
    import asyncio

    from topod.discover.udev import UdevSettings, UdevWatcher

    facts = json.loads((tree / "topod-fixture.json").read_text())["devices"]
    rdma = next(a for a, f in facts.items() if f["kind"] == "rdma")
    path = str((Path("/sys/bus/pci/devices") / rdma).resolve())
    watcher = UdevWatcher(UdevSettings(quiet_s=0.1, max_delay_s=1.0))
    # umockdev 0.17's remove_device sends no uevent: send 'remove' first, as the kernel would.
    testbed.uevent(path, "remove")
    testbed.remove_device(path)
    events = _events(watcher)
    request = asyncio.run(watcher.wait_for_change(timeout=1.0))
    return {"rdma": rdma, "events": events, "request": request.to_json() if request else None,
            "still_listed": (Path("/sys/bus/pci/devices") / rdma).exists()}


def scenario_daemon_hotplug(tree: Path, testbed) -> dict:
    """The real daemon on the live root (here: the testbed), read-only (IRQ balancing off,
    no probes): a hot-added PCI function, then its removal, each reach the topology once
    through the daemon's own udev source, debounced."""
    import asyncio
    import tempfile

    from topod.config import parse_config
    from topod.service.daemon import Daemon

    work = Path(tempfile.mkdtemp(prefix="topod-umockdev-"))
    config = parse_config('[irq]\nmode = "off"\n[probe]\nenabled = false\n[udev]\nquiet_seconds = 0.2\n'
                          '[daemon]\nrescan_interval_seconds = 3600\n').with_overrides(
        root="/", socket=str(work / "topod.sock"), state_dir=str(work / "state"))
    parent = "/devices/pci0000:60/0000:60:01.0"
    gpu = f"{parent}/0000:61:00.0"

    async def until(predicate, timeout: float = 10.0) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def drive() -> dict:
        daemon = Daemon(config)
        events: list[dict] = []
        daemon.bus.add_listener(lambda record: events.append(record) if record["event"] == "topology_changed" else None)
        running = asyncio.create_task(daemon.run())
        active = await until(lambda: daemon.hotplug is not None)
        devices_before = len(daemon.state.topology.pci_devices)
        testbed.add_from_string(function_record(parent, 0x8086, 0x352A, 0x060400, "pcieport"))
        testbed.add_from_string(function_record(gpu, 0x10DE, 0x2330, 0x030200, "nvidia"))
        added = await until(lambda: len(events) >= 1)
        devices_added = len(daemon.state.topology.pci_devices)
        await asyncio.sleep(0.5)  # a debounced burst is one rediscovery, not one per event
        changes_after_add = len(events)
        testbed.uevent(f"/sys{gpu}", "remove")
        testbed.remove_device(f"/sys{gpu}")
        removed = await until(lambda: len(events) >= changes_after_add + 1)
        devices_removed = len(daemon.state.topology.pci_devices)
        hotplug = daemon.hotplug.to_json() if daemon.hotplug else None
        daemon.stop()
        await running
        return {"active": active, "hotplug": hotplug, "devices_before": devices_before,
                "devices_added": devices_added, "devices_removed": devices_removed, "added": added,
                "removed": removed, "changes_after_add": changes_after_add, "events": events}

    try:
        return asyncio.run(drive())
    finally:
        shutil.rmtree(work, ignore_errors=True)


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in dict(globals()).items() if name.startswith("scenario_")}


def main(argv: list[str]) -> int:
    import gc
    import time

    tree, names = Path(argv[0]), argv[1:]
    results: dict[str, dict] = {}
    for name in names:
        started = time.monotonic()
        testbed = new_testbed(tree)
        try:
            results[name] = {"ok": True, **SCENARIOS[name](tree, testbed)}
        except Exception:  # reported to the pytest side, which fails the test with it
            results[name] = {"ok": False, "error": traceback.format_exc()}
        results[name]["seconds"] = round(time.monotonic() - started, 3)
        del testbed
        gc.collect()  # the testbed's finalizer removes its directory and unsets UMOCKDEV_DIR
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
