"""The systemd units: consistent with the daemon's defaults and CLI, accepted by
`systemd-analyze verify`, and hardened to an exposure score of at most 2.0."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from topod.config import SCHEMA
from topod.service.main import EX_CONFIG, build_parser

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
MAX_EXPOSURE = 2.0
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")

# systemd's ProtectKernelTunables= list (src/core/namespace.c): we spell it out by hand
# because that option would also make /proc/irq read-only.
KERNEL_TUNABLES_READ_ONLY = {"/proc/acpi", "/proc/apm", "/proc/asound", "/proc/bus", "/proc/fs",
                             "/proc/latency_stats", "/proc/mtrr", "/proc/scsi", "/proc/sys",
                             "/proc/sysrq-trigger", "/proc/timer_stats", "/sys", "/sys/fs/bpf",
                             "/sys/kernel/debug", "/sys/kernel/tracing"}
KERNEL_TUNABLES_INACCESSIBLE = {"/proc/kallsyms", "/proc/kcore"}


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections -> (key, value) in order; systemd allows repeated keys, configparser not."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path.name}: not a key=value line: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: dict, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key} set {len(found)} times"
    return found[0]


def paths(unit: dict, key: str) -> set[str]:
    return {p.lstrip("-") for value in values(unit, "Service", key) for p in value.split()}


SERVICE = parse_unit(UNITS / "topod.service")
SOCKET = parse_unit(UNITS / "topod.socket")


# -- consistency with the daemon ------------------------------------------------------------
def test_socket_unit_matches_the_daemon_defaults():
    assert one(SOCKET, "Socket", "ListenStream") == SCHEMA["daemon"]["socket"][1]
    assert one(SOCKET, "Socket", "SocketMode") == SCHEMA["daemon"]["socket_mode"][1]
    assert one(SOCKET, "Socket", "SocketGroup") == SCHEMA["daemon"]["group"][1]
    assert one(SOCKET, "Socket", "Service") == "topod.service"
    assert one(SOCKET, "Socket", "FileDescriptorName") == "api"  # select_socket()'s default name


def test_exec_start_is_accepted_by_the_topod_command_line():
    argv = shlex.split(one(SERVICE, "Service", "ExecStart"))
    assert argv[0] == "/usr/bin/topod"
    args = build_parser().parse_args(argv[1:])
    assert args.config == "/etc/topod/topod.toml"


def test_service_is_a_watched_notify_service_that_reloads_on_sighup():
    assert one(SERVICE, "Service", "Type") == "notify"
    assert one(SERVICE, "Service", "NotifyAccess") == "main"
    assert one(SERVICE, "Service", "WatchdogSec") == "30"
    assert one(SERVICE, "Service", "Restart") == "on-failure"
    # topoctl reload waits for the daemon's verdict: `systemctl reload` fails on a refused file.
    assert one(SERVICE, "Service", "ExecReload") == "/usr/bin/topoctl reload"
    assert one(SERVICE, "Service", "RestartPreventExitStatus") == str(EX_CONFIG)


def test_runtime_directory_outlives_the_service_so_the_socket_survives_restarts():
    assert one(SERVICE, "Service", "RuntimeDirectory") == "topod"
    assert one(SERVICE, "Service", "RuntimeDirectoryPreserve") == "yes"
    assert Path(one(SOCKET, "Socket", "ListenStream")).parent == Path("/run/topod")
    assert one(SERVICE, "Service", "StateDirectory") == "topod"
    assert f"/var/lib/{one(SERVICE, 'Service', 'StateDirectory')}" == SCHEMA["daemon"]["state_dir"][1]


def test_proc_irq_stays_writable_and_every_other_kernel_tunable_is_read_only():
    assert one(SERVICE, "Service", "ProtectKernelTunables") == "no"
    read_only = paths(SERVICE, "ReadOnlyPaths")
    assert "/proc/irq" not in read_only
    assert KERNEL_TUNABLES_READ_ONLY <= read_only
    assert KERNEL_TUNABLES_INACCESSIBLE <= paths(SERVICE, "InaccessiblePaths")
    assert "/proc/irq" in paths(SERVICE, "ReadWritePaths")
    assert one(SERVICE, "Service", "ProtectSystem") == "strict"
    assert one(SERVICE, "Service", "ProcSubset") == "all"  # pid would hide /proc/irq


def test_no_capabilities_and_only_unix_and_netlink_sockets():
    assert one(SERVICE, "Service", "CapabilityBoundingSet") == ""
    assert one(SERVICE, "Service", "AmbientCapabilities") == ""
    assert one(SERVICE, "Service", "NoNewPrivileges") == "yes"
    assert one(SERVICE, "Service", "RestrictAddressFamilies").split() == ["AF_UNIX", "AF_NETLINK"]
    assert one(SERVICE, "Service", "UMask") == "0077"


def test_irqbalance_is_stopped_before_topod_starts():
    assert "irqbalance.service" in values(SERVICE, "Unit", "Conflicts")
    assert "irqbalance.service" in " ".join(values(SERVICE, "Unit", "After"))


def test_sysusers_declares_the_socket_group():
    lines = [line.split() for line in (UNITS / "topod.sysusers").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert ["g", SCHEMA["daemon"]["group"][1], "-"] in lines


def test_tmpfiles_modes_match_the_unit():
    entries = {fields[1]: fields for fields in (line.split() for line in (UNITS / "topod.tmpfiles").read_text()
                                               .splitlines() if line.strip() and not line.startswith("#"))}
    assert entries["/run/topod"][:3] == ["d", "/run/topod", one(SERVICE, "Service", "RuntimeDirectoryMode")]
    assert entries["/var/lib/topod"][:3] == ["d", "/var/lib/topod", one(SERVICE, "Service", "StateDirectoryMode")]
    assert one(SOCKET, "Socket", "DirectoryMode") == one(SERVICE, "Service", "RuntimeDirectoryMode")


# -- systemd-analyze ---------------------------------------------------------------------
def verify_root(base: Path, service_text: str) -> Path:
    """A minimal root for `systemd-analyze verify --root`: the host's unit library (for
    sysinit.target and friends), stub executables for ExecStart=/ExecReload= (verify
    only checks that they exist and are executable) and our units in /etc."""
    root = base / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    for name in ("topod", "topoctl"):
        stub = root / "usr/bin" / name
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    library = next(p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir())
    shutil.copytree(library, root / "usr/lib/systemd/system", symlinks=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    (units / "topod.service").write_text(service_text)
    shutil.copy(UNITS / "topod.socket", units / "topod.socket")
    return root


def run_verify(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SYSTEMD_ANALYZE, "verify", f"--root={root}", "--man=no",
                           "topod.service", "topod.socket"], capture_output=True, text=True, timeout=60)


@needs_analyze
def test_systemd_analyze_verify_accepts_the_units_without_a_warning(tmp_path):
    result = run_verify(verify_root(tmp_path, (UNITS / "topod.service").read_text()))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@needs_analyze
def test_systemd_analyze_verify_would_catch_a_broken_unit(tmp_path):
    # verify exits 0 on unknown keys and bad values, so the check above also demands
    # silence; this proves that a mistake does make it speak.
    broken = (UNITS / "topod.service").read_text().replace("NoNewPrivileges=yes", "NoNewPrivilege=yes")
    result = run_verify(verify_root(tmp_path, broken))
    assert "Unknown key 'NoNewPrivilege'" in result.stdout + result.stderr


@needs_analyze
def test_security_exposure_is_at_most_two():
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=yes", str(UNITS / "topod.service")],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for topod\.service: (\d+\.\d+)", result.stdout)
    assert match, f"no score in: {result.stdout[-500:]} {result.stderr[-500:]}"
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout
    threshold = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=yes", f"--threshold={int(MAX_EXPOSURE * 10)}",
                                str(UNITS / "topod.service")], capture_output=True, text=True, timeout=60)
    assert threshold.returncode == 0


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers is not installed")
def test_systemd_sysusers_creates_the_topod_group(tmp_path):
    (tmp_path / "etc").mkdir()
    result = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(UNITS / "topod.sysusers")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    groups = [line.split(":")[0] for line in (tmp_path / "etc/group").read_text().splitlines()]
    assert groups == ["topod"]


@pytest.mark.skipif(shutil.which("systemd-tmpfiles") is None, reason="systemd-tmpfiles is not installed")
def test_systemd_tmpfiles_creates_the_directories_with_the_units_modes(tmp_path):
    result = subprocess.run(["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(UNITS / "topod.tmpfiles")],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    for directory, key in (("run/topod", "RuntimeDirectoryMode"), ("var/lib/topod", "StateDirectoryMode")):
        assert (tmp_path / directory).stat().st_mode & 0o7777 == int(one(SERVICE, "Service", key), 8)
