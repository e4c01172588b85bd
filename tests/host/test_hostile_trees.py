"""Hostile host trees: whatever a tree holds (garbage, truncation, FIFOs, loops, devices,
directories for files, 1 GiB sparse files, huge CPU ranges), discovery finishes quickly
with a Topology or one TopodError, and `topoctl topo --json` exits 0 or 1 with no
traceback (and the error as one line on stderr when it fails)."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topod.discover import discover
from topod.errors import NotAHostTreeError, TopodError
from topod.host import HostRoot
from topod.hostspec import build_host
from topod.topojson import topology_to_json
from timebox import within as _within

REPO = Path(__file__).resolve().parents[2]
TOPOCTL = [sys.executable, "-m", "topod.cli.topoctl", "topo", "--json", "--root"]
DISCOVERY_SECONDS = 10  # generous: this is a shared 2-core machine; a hang is what it catches
TOPOCTL_SECONDS = 60

# Small but complete: two NUMA nodes, hyper-threads and caches, a switch with a GPU and an
# RDMA NIC on each node, NVSwitch, NVMe, a NIC, nvml.json.
MINI_SPEC = {
    "name": "mini",
    "description": "two-node, two-GPU host for hostile-input tests",
    "pcie_gen": 4,
    "cpu": {"sockets": 2, "cores_per_socket": 2, "threads_per_core": 2, "memory_gib_per_node": 4},
    "nvml": {"model": "NVIDIA H800", "fabric": "nvswitch", "links_per_gpu": 2, "memory_mib": 1000},
    "root_complex": [
        {"node": 0, "switches": [{"devices": ["gpu", "rdma"]}], "devices": ["nvme", "nvswitch"]},
        {"node": 1, "switches": [{"devices": ["gpu", "rdma"]}], "root_bus_devices": ["nic"]},
    ],
}

# Hundreds of copies are made: on tmpfs a copy takes 7 ms, on this machine's ext4 0.5 s.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

# What discovery reads: mutations aim here (proc/irq and /dev matter to other commands).
READ_PREFIXES = ("sys/", "nvml.json")


def _build_base() -> tuple[Path, list[str], list[str]]:
    work = tempfile.mkdtemp(prefix="topod-hostile-base-", dir=SCRATCH)
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    base = Path(work) / "tree"
    build_host(MINI_SPEC, base)
    files, dirs = [], []
    for directory, subdirs, names in os.walk(base):
        rel_dir = os.path.relpath(directory, base)
        for name in names + [d for d in subdirs if os.path.islink(os.path.join(directory, d))]:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel.startswith(READ_PREFIXES):
                files.append(rel)
        for name in subdirs:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel.startswith("sys/") and not os.path.islink(os.path.join(directory, name)):
                dirs.append(rel)
    return base, sorted(files), sorted(dirs)


BASE, FILES, DIRS = _build_base()


def _replace(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.is_fifo():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _apply(root: Path, kind: str, rel: str, payload: bytes) -> None:
    path = root / rel
    if not os.path.lexists(path.parent) or not path.parent.is_dir():
        return  # an earlier mutation took its directory away
    if kind == "garbage":
        _replace(path)
        path.write_bytes(payload)
    elif kind == "truncate":
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            path.write_bytes(data[: len(payload) % (len(data) + 1)])
    elif kind == "empty":
        _replace(path)
        path.write_bytes(b"")
    elif kind == "remove":
        _replace(path)
    elif kind == "fifo":
        _replace(path)
        os.mkfifo(path)
    elif kind == "directory":
        _replace(path)
        path.mkdir()
    elif kind == "loop":
        _replace(path)
        os.symlink(path.name, path)
    elif kind == "loop_pair":
        other = path.with_name(path.name + ".other")
        _replace(path)
        _replace(other)
        os.symlink(other.name, path)
        os.symlink(path.name, other)
    elif kind == "dev_zero":
        _replace(path)
        os.symlink("/dev/zero", path)
    elif kind == "huge_range":
        _replace(path)
        path.write_text("0-4294967295\n")
    elif kind == "huge_mask":
        _replace(path)
        path.write_text(",".join(["ffffffff"] * 20_000) + "\n")
    elif kind == "sparse":
        _replace(path)
        path.write_bytes(payload)
        os.truncate(path, 1 << 30)
    elif kind == "over_cap":
        _replace(path)
        path.write_bytes((b"0," * 600_000) + b"\n")
    elif kind == "dangling":
        _replace(path)
        os.symlink("../../nowhere/at/all", path)


FILE_KINDS = ("garbage", "truncate", "empty", "remove", "fifo", "directory", "loop", "loop_pair",
              "dev_zero", "huge_range", "huge_mask", "sparse", "over_cap", "dangling")
DIR_KINDS = ("remove", "loop", "fifo", "garbage", "empty")

mutation = st.one_of(
    st.tuples(st.sampled_from(FILE_KINDS), st.sampled_from(FILES), st.binary(max_size=48)),
    st.tuples(st.sampled_from(DIR_KINDS), st.sampled_from(DIRS), st.binary(max_size=48)),
)
mutations = st.lists(mutation, min_size=1, max_size=5)


@contextmanager
def _mutated(steps):
    work = Path(tempfile.mkdtemp(prefix="topod-hostile-", dir=SCRATCH))
    root = work / "tree"
    try:
        shutil.copytree(BASE, root, symlinks=True)
        for kind, rel, payload in steps:
            _apply(root, kind, rel, payload)
        yield root
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _discover_or_error(root: Path):
    started = time.perf_counter()
    with _within(DISCOVERY_SECONDS):
        try:
            result = discover(HostRoot(root), live_nvml=False)
        except TopodError as exc:
            result = exc
    return result, time.perf_counter() - started


@settings(max_examples=200, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_discovery_of_a_mutated_tree_ends_in_a_topology_or_one_topod_error(steps):
    with _mutated(steps) as root:
        result, seconds = _discover_or_error(root)
    assert seconds < DISCOVERY_SECONDS
    if isinstance(result, TopodError):
        assert isinstance(result, NotAHostTreeError) and "\n" not in str(result)
        return
    document = json.loads(json.dumps(topology_to_json(result)))
    assert all(set(w) == {"code", "path", "reason"} for w in document["warnings"])


def _topoctl(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([*TOPOCTL, str(root)], capture_output=True, text=True, timeout=TOPOCTL_SECONDS,
                          env=env, stdin=subprocess.DEVNULL)


def _assert_clean_exit(done: subprocess.CompletedProcess) -> None:
    """Exit 0 with a JSON document, or 1 with the error as one JSON line. With --json,
    stderr holds JSON lines only: topoctl's one announce line (daemon or host view) and,
    on failure, the error object, last."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr
    lines = [json.loads(line) for line in done.stderr.strip().splitlines()]
    errors = [line for line in lines if set(line) == {"code", "message"}]
    if done.returncode == 0:
        json.loads(done.stdout)
        assert not errors, done.stderr
    else:
        assert len(errors) == 1 and lines[-1] is errors[0], done.stderr
        assert errors[0]["code"] and "\n" not in errors[0]["message"]
        assert len(lines) <= 2, done.stderr


@settings(max_examples=25, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_topoctl_topo_on_a_mutated_tree_exits_cleanly(steps):
    with _mutated(steps) as root:
        _assert_clean_exit(_topoctl(root))


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse", "directory", "loop"])
def test_topoctl_topo_does_not_hang_on_a_special_file(kind):
    with _mutated([(kind, "sys/devices/system/cpu/online", b"0-3\n"), (kind, "nvml.json", b"{}")]) as root:
        done = _topoctl(root)
    _assert_clean_exit(done)
    assert done.returncode == 0
    codes = {(w["code"], w["path"]) for w in json.loads(done.stdout)["warnings"]}
    expected = {"fifo": "not_a_regular_file", "dev_zero": "not_a_regular_file", "sparse": "file_too_large",
                "directory": "not_a_regular_file", "loop": "read_error"}[kind]
    assert {(expected, "sys/devices/system/cpu/online"), (expected, "nvml.json")} <= codes


def test_topoctl_topo_gives_one_line_when_no_cpu_can_be_read():
    with _mutated([("remove", "sys/devices/system/cpu", b"")]) as root:
        (root / "sys/devices/system/cpu").mkdir()
        os.mkfifo(root / "sys/devices/system/cpu/online")
        done = _topoctl(root)
    _assert_clean_exit(done)
    assert done.returncode == 1
    assert json.loads(done.stderr.strip().splitlines()[-1])["code"] == "not_a_host_tree"


def test_snapshot_skips_special_and_oversized_files_without_blocking(tmp_path):
    import tarfile

    from topod.snapshot import write_snapshot

    steps = [("fifo", "sys/devices/system/cpu/online", b""), ("dev_zero", "sys/devices/system/cpu/possible", b""),
             ("sparse", "sys/devices/system/node/node0/meminfo", b"x")]
    with _mutated(steps) as root:
        host = HostRoot(root)
        with _within(DISCOVERY_SECONDS):
            write_snapshot(host, str(tmp_path / "snap.tar.gz"), "snap")
        problems = {(p.code, p.path) for p in host.read_problems}
    assert problems == {("not_a_regular_file", "sys/devices/system/cpu/online"),
                        ("not_a_regular_file", "sys/devices/system/cpu/possible"),
                        ("file_too_large", "sys/devices/system/node/node0/meminfo")}
    with tarfile.open(tmp_path / "snap.tar.gz") as archive:
        names = set(archive.getnames())
    assert "snap/sys/devices/system/cpu/present" in names
    assert not {"snap/sys/devices/system/cpu/online", "snap/sys/devices/system/node/node0/meminfo"} & names


def _daemon_on(root: Path) -> tuple[int | None, str, dict | None]:
    """Start topod as a user would (defaults plus --root/--socket/--state-dir) on the tree:
    (exit status or None while running, its output, /v1/health or None)."""
    from topod.client import ApiError, Client

    work = root.parent
    socket_path = str(work / "topod.sock")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("NOTIFY_SOCKET", None)
    log = work / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "topod.service.main", "--root", str(root),
                                    "--socket", socket_path, "--state-dir", str(work / "state")],
                                   stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)
    health = None
    try:
        deadline = time.monotonic() + TOPOCTL_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            try:
                health = Client(socket_path, timeout=10).health()
                break
            except (ApiError, OSError):
                time.sleep(0.05)
        if health is not None:
            time.sleep(0.5)  # the loops' first iterations: a crash would show now
            health = Client(socket_path, timeout=10).health()
    finally:
        status = process.poll()
        if status is None:
            process.terminate()
            process.wait(timeout=20)
    return status, log.read_text(errors="replace"), health


@settings(max_examples=12, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_the_daemon_on_a_mutated_tree_serves_or_exits_with_one_line(steps):
    with _mutated(steps) as root:
        status, output, health = _daemon_on(root)
    assert "Traceback" not in output, output[-3000:]
    if status is None:
        assert health is not None and 0 <= health["gpus_free"] <= health["gpus"], output[-2000:]
    else:
        assert status == 1, output[-2000:]
        assert output.strip().splitlines()[-1].startswith("topod: "), output[-2000:]
