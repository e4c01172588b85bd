"""Output files: whole or not at all, and never a device or a link swapped for a file."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from topod.outfile import replaced_whole


def _leftovers(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if ".tmp" in name)


def test_a_new_file_is_written_and_no_temporary_is_left(tmp_path):
    target = tmp_path / "out.svg"
    with replaced_whole(str(target)) as handle:
        handle.write(b"<svg/>")
    assert target.read_bytes() == b"<svg/>" and _leftovers(tmp_path) == []


def test_a_failure_half_way_keeps_the_old_file_whole(tmp_path):
    target = tmp_path / "out.svg"
    target.write_bytes(b"old picture")
    with pytest.raises(RuntimeError), replaced_whole(str(target)) as handle:
        handle.write(b"half a new")
        raise RuntimeError("renderer died")
    assert target.read_bytes() == b"old picture" and _leftovers(tmp_path) == []


def test_an_error_names_the_file_asked_for_not_the_temporary(tmp_path):
    wanted = tmp_path / "missing" / "out.tar.gz"
    with pytest.raises(FileNotFoundError) as raised, replaced_whole(str(wanted)) as handle:
        handle.write(b"x")
    assert raised.value.filename == str(wanted)


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    real = tmp_path / "real.dot"
    link = tmp_path / "link.dot"
    link.symlink_to(real)
    with replaced_whole(str(link)) as handle:
        handle.write(b"digraph {}")
    assert link.is_symlink() and real.read_bytes() == b"digraph {}"


def test_a_fifo_is_written_to_not_replaced(tmp_path):
    """What stands for any name that is not a regular file (/dev/stdout, a device): a
    test never risks the machine's real /dev nodes."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    with replaced_whole(str(fifo)) as handle:
        handle.write(b"through the pipe")
    reader.join(timeout=5)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_hard_linked_output_is_replaced_and_its_other_name_keeps_its_bytes(tmp_path):
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me")
    target = tmp_path / "out.svg"
    os.link(precious, target)
    with replaced_whole(str(target)) as handle:
        handle.write(b"<svg/>")
    assert target.read_bytes() == b"<svg/>" and precious.read_bytes() == b"keep me"


@pytest.mark.parametrize("plant", ["symlink", "hard link"])
def test_a_name_planted_where_the_temporary_goes_is_not_written_through(tmp_path, monkeypatch, plant):
    """In a shared directory another user may guess the temporary's name first: the open
    fails (O_EXCL, O_NOFOLLOW) instead of writing into what that name points at."""
    monkeypatch.setattr(os, "urandom", lambda n: b"\x01" * n)
    target = tmp_path / "out.svg"
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me")
    planted = tmp_path / f"out.svg.{'01' * 6}.tmp"
    planted.symlink_to(precious) if plant == "symlink" else os.link(precious, planted)
    with pytest.raises(FileExistsError) as raised, replaced_whole(str(target)) as handle:
        handle.write(b"<svg/>")
    assert raised.value.filename == str(target)
    assert precious.read_bytes() == b"keep me" and not target.exists()
    assert os.path.lexists(planted), "a name topod did not make was removed"
