"""HostRoot reads: regular files only, capped, and every failure but "missing" visible."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topod.cappedread import READ_CAP, read_cap
from topod.errors import (
    HostFileMissingError,
    HostFileTooLargeError,
    HostFileUnreadableError,
    HostPermissionError,
    HostReadError,
    NotAHostTreeError,
    NotARegularFileError,
)
from topod.host import PROBLEMS_KEPT, HostRoot
from timebox import within


@pytest.fixture()
def root(tmp_path):
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    return tmp_path


def _codes(host: HostRoot) -> list[tuple[str, str]]:
    return [(p.code, p.path) for p in host.read_problems]


def kernel_interrupts(cpus: int, irqs: int) -> str:
    """/proc/interrupts as kernel/irq/proc.c prints it: a 'CPU%-8d' header, then per line
    '%*d: ' and one '%10u ' per CPU, chip, hwirq and action; then x86's summary lines."""
    prec = len(str(irqs))
    lines = [" " * (prec + 8) + "".join(f"CPU{c:<8}" for c in range(cpus)) + "\n"]
    row = "".join(f"{4294967295:10} " for _ in range(cpus))
    for irq in range(irqs):
        lines.append(f"{irq:>{prec}}: {row} IR-PCI-MSIX-0000:{irq % 256:02x}:00.0 {irq}-edge      "
                     f"mlx5_comp{irq}@pci:0000:{irq % 256:02x}:00.0\n")
    for name in ("NMI", "LOC", "SPU", "PMI", "IWI", "RTR", "RES", "CAL", "TLB", "TRM", "THR", "DFR", "MCE",
                 "MCP", "HYP", "HRE", "HVS", "PIN", "NPI", "PIW"):
        lines.append(f"{name:>{prec}}: {row}  {name} interrupts\n")
    lines.append(f"{'ERR':>{prec}}: {0:10}\n{'MIS':>{prec}}: {0:10}\n")
    return "".join(lines)


def test_fifo_is_refused_without_blocking_and_recorded(root):
    os.mkfifo(root / "proc/interrupts")
    host = HostRoot(root)
    with within(5):
        assert host.read("proc/interrupts") is None
        with pytest.raises(NotARegularFileError, match="FIFO"):
            host.read_bytes("proc/interrupts")
    assert _codes(host) == [("not_a_regular_file", "proc/interrupts")]


def test_endless_character_device_is_never_opened(root):
    os.symlink("/dev/zero", root / "sys/devices/system/cpu/online")
    host = HostRoot(root)
    with within(5):
        assert host.read("sys/devices/system/cpu/online") is None
    problem = host.read_problems[0]
    assert problem.code == "not_a_regular_file" and "character device" in problem.reason


def test_directory_where_a_file_belongs_is_reported_as_not_a_regular_file(root):
    (root / "sys/devices/system/cpu/online").mkdir()
    host = HostRoot(root)
    assert host.read("sys/devices/system/cpu/online") is None
    assert _codes(host) == [("not_a_regular_file", "sys/devices/system/cpu/online")]


def test_one_gib_sparse_file_is_refused_fast_without_reading_it(root):
    path = root / "sys/devices/system/cpu/online"
    path.write_bytes(b"0-3\n")
    os.truncate(path, 1 << 30)
    host = HostRoot(root)
    started = time.perf_counter()
    assert host.read("sys/devices/system/cpu/online") is None
    assert time.perf_counter() - started < 0.5
    assert _codes(host) == [("file_too_large", "sys/devices/system/cpu/online")]
    with pytest.raises(HostFileTooLargeError, match="1073741824 bytes"):
        host.read_bytes("sys/devices/system/cpu/online")


def test_content_beyond_the_cap_is_refused_even_when_the_size_is_not_told(root, monkeypatch):
    # procfs reports st_size 0 for every file: the cap must hold while reading too.
    path = root / "proc/stat"
    path.write_bytes(b"x" * 5000)
    real_stat, real_fstat = os.stat, os.fstat

    def zero_size(result):
        values = list(result)
        values[6] = 0  # st_size
        return os.stat_result(values)

    monkeypatch.setattr(os, "stat", lambda p, *a, **k: zero_size(real_stat(p, *a, **k)))
    monkeypatch.setattr(os, "fstat", lambda fd: zero_size(real_fstat(fd)))
    host = HostRoot(root)
    assert host.read_bytes("proc/stat", limit=5000) == b"x" * 5000
    with pytest.raises(HostFileTooLargeError, match="4999-byte cap"):
        host.read_bytes("proc/stat", limit=4999)


def test_proc_interrupts_of_4096_cpus_fits_its_own_cap_but_not_the_default():
    text = kernel_interrupts(4096, 200)
    size = len(text.encode())
    assert 9_500_000 < size < 10_500_000  # 9,973,086 bytes: 4,096 x 11 per line, 223 lines
    assert size > READ_CAP
    assert read_cap("proc/interrupts") >= 4 * size  # room for ~1,450 IRQ lines at 4,096 CPUs
    assert read_cap("/proc/interrupts") == read_cap("proc/interrupts")
    assert read_cap("sys/devices/system/cpu/online") == READ_CAP


def test_proc_interrupts_of_4096_cpus_is_read_whole(root):
    text = kernel_interrupts(4096, 200)
    (root / "proc/interrupts").write_text(text)
    host = HostRoot(root)
    assert host.read("proc/interrupts") == text
    assert not host.read_problems


def test_permission_denied_is_reported_distinctly_from_missing(root, monkeypatch):
    (root / "sys/devices/system/cpu/online").write_text("0-3\n")
    real_open = os.open

    def deny(path, flags, *args, **kwargs):
        if str(path).endswith("cpu/online"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    host = HostRoot(root)
    assert host.read("sys/devices/system/cpu/online") is None
    assert host.read("sys/devices/system/cpu/missing") is None
    assert _codes(host) == [("permission_denied", "sys/devices/system/cpu/online")]
    with pytest.raises(HostPermissionError, match="Permission denied"):
        host.read_bytes("sys/devices/system/cpu/online")
    with pytest.raises(HostFileMissingError):
        host.read_bytes("sys/devices/system/cpu/missing")


def test_io_error_while_reading_is_a_read_error(root, monkeypatch):
    (root / "proc/stat").write_text("cpu 1 2 3\n")

    def eio(fd, size):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "read", eio)
    host = HostRoot(root)
    assert host.read("proc/stat") is None
    assert host.read_problems[0].code == "read_error" and "EIO" in host.read_problems[0].reason
    with pytest.raises(HostFileUnreadableError):
        host.read_bytes("proc/stat")


def test_symlink_loop_is_a_read_error_and_does_not_resolve(root):
    os.symlink("online", root / "sys/devices/system/cpu/online")
    host = HostRoot(root)
    assert host.read("sys/devices/system/cpu/online") is None
    assert host.read_problems[0].code == "read_error" and "ELOOP" in host.read_problems[0].reason
    assert host.resolve("sys/devices/system/cpu/online") is None


def test_every_read_failure_is_a_host_read_error(root):
    os.mkfifo(root / "proc/fifo")
    host = HostRoot(root)
    for rel in ("proc/fifo", "proc/missing", "proc"):
        with pytest.raises(HostReadError):
            host.read_bytes(rel)


def test_unreadable_directory_listing_is_recorded_but_missing_is_not(root, monkeypatch):
    real_listdir = os.listdir

    def deny(path):
        if str(path).endswith("/proc"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", deny)
    host = HostRoot(root)
    assert host.listdir("proc") == []
    assert host.listdir("nowhere") == []
    assert _codes(host) == [("permission_denied", "proc")]


def test_recent_problems_are_bounded_and_collected_per_thread(root):
    os.mkfifo(root / "proc/fifo")
    host = HostRoot(root)
    for _ in range(PROBLEMS_KEPT + 50):
        host.read("proc/fifo")
    assert len(host.read_problems) == PROBLEMS_KEPT
    with host.collecting_problems() as mine:
        host.read("proc/fifo")
        other = threading.Thread(target=host.read, args=("proc/fifo",))
        other.start()
        other.join()
    host.read("proc/fifo")
    assert [p.code for p in mine] == ["not_a_regular_file"]


def test_resolve_stays_inside_the_root(root):
    (root / "sys/devices/pci0000:00/0000:00:01.0").mkdir(parents=True)
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.0", root / "sys/bus/pci/devices/0000:00:01.0")
    os.symlink("/", root / "sys/bus/pci/devices/0000:00:02.0")
    os.symlink("../../../devices/none", root / "sys/bus/pci/devices/0000:00:03.0")
    host = HostRoot(root)
    assert host.resolve("sys/bus/pci/devices/0000:00:01.0") == "/sys/devices/pci0000:00/0000:00:01.0"
    assert host.resolve("sys/bus/pci/devices/0000:00:02.0") is None
    assert host.resolve("sys/bus/pci/devices/0000:00:03.0") is None


def test_open_directory_reads_by_name_with_the_same_checks(root):
    cpu = root / "sys/devices/system/cpu"
    (cpu / "online").write_text("0-3\n")
    os.mkfifo(cpu / "fifo")
    os.mkfifo(root / "proc/fifo_dir")
    host = HostRoot(root)
    with within(5):
        with host.open_dir("/sys/devices/system/cpu/") as directory:
            assert directory.read_line("online") == "0-3"
            assert directory.read("missing") is None
            assert directory.read("fifo") is None
            assert directory.listdir() == ["fifo", "online"]
        assert host.open_dir("proc/fifo_dir") is None
        assert host.open_dir("sys/devices/system/cpu/online") is None
        assert host.open_dir("nowhere") is None
    assert _codes(host) == [("not_a_regular_file", "sys/devices/system/cpu/fifo")]


def test_a_file_its_listing_calls_regular_is_read_without_a_stat_and_still_checked(root, monkeypatch):
    cpu = root / "sys/devices/system/cpu"
    (cpu / "online").write_text("0-3\n")
    (cpu / "big").write_text("x" * (READ_CAP + 1))
    os.mkfifo(cpu / "fifo")
    os.symlink("fifo", cpu / "link_to_fifo")
    os.symlink("online", cpu / "link_to_online")
    host = HostRoot(root)
    stats: list[str] = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **k: stats.append(str(path)) or real_stat(path, *a, **k))
    with within(5), host.open_dir("sys/devices/system/cpu") as directory:
        assert directory.listdir() == ["big", "fifo", "link_to_fifo", "link_to_online", "online"]
        assert directory.regular == {"big", "online"}  # by the entries' own types
        assert directory.read_line("online") == "0-3"
        assert stats == []  # listed regular: no stat before the open
        assert directory.read("big") is None  # over the cap: refused (after an open of a plain file)
        # a link or a FIFO is looked at (stat) before anything is opened, as without a listing
        assert directory.read("fifo") is None and directory.read("link_to_fifo") is None
        assert directory.read_line("link_to_online") == "0-3"
        assert stats == ["fifo", "link_to_fifo", "link_to_online"]
    assert _codes(host) == [("file_too_large", "sys/devices/system/cpu/big"),
                            ("not_a_regular_file", "sys/devices/system/cpu/fifo"),
                            ("not_a_regular_file", "sys/devices/system/cpu/link_to_fifo")]


def test_a_listed_file_swapped_before_its_read_is_caught(root):
    cpu = root / "sys/devices/system/cpu"
    for name in ("becomes_fifo", "becomes_link", "becomes_nothing"):
        (cpu / name).write_text("1\n")
    (cpu / "target").write_text("2\n")
    host = HostRoot(root)
    with within(5), host.open_dir("sys/devices/system/cpu") as directory:
        directory.listdir()
        assert {"becomes_fifo", "becomes_link", "becomes_nothing"} <= directory.regular
        (cpu / "becomes_fifo").unlink()
        os.mkfifo(cpu / "becomes_fifo")
        (cpu / "becomes_link").unlink()
        os.symlink("target", cpu / "becomes_link")
        (cpu / "becomes_nothing").unlink()
        assert directory.read("becomes_fifo") is None  # opened without blocking, refused unread
        assert directory.read_line("becomes_link") == "2"  # not the entry listed: looked at again
        assert directory.read("becomes_nothing") is None  # gone: missing, silent
    assert _codes(host) == [("not_a_regular_file", "sys/devices/system/cpu/becomes_fifo")]


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="/.ab", max_size=12))
def test_the_root_text_is_what_pathlib_would_print(raw):
    # HostRoot keeps the root as text so that pathlib is imported only where a Path is
    # wanted; the text must be exactly the Path's, or messages and paths would differ
    from pathlib import PurePosixPath

    from topod.pathtext import path_text

    assert path_text(raw) == str(PurePosixPath(raw))


def test_a_host_root_made_without_pathlib_still_gives_a_path(tmp_path):
    from pathlib import Path

    (tmp_path / "sys" / "devices" / "system" / "cpu").mkdir(parents=True)
    host = HostRoot(f"{tmp_path}//./")
    assert host.root_text == str(tmp_path) and host.root == Path(tmp_path)
    assert host.path("/proc/interrupts") == tmp_path / "proc" / "interrupts"
    with pytest.raises(NotAHostTreeError, match=f"--root {tmp_path}/nothing: no such directory"):
        HostRoot(tmp_path / "nothing")
    with pytest.raises(TypeError):
        HostRoot(b"/")
