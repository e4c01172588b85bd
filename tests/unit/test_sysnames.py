"""topod.sysnames matches what the regular expressions it replaced matched, except where
it is stricter on purpose: a trailing newline (which `$` let through) and non-ASCII
digits (which `\\d` took, aliasing `cpu١` to cpu1) are refused."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from topod.discover.hugepages import parse_hugepage_size
from topod.discover.identity import parse_hostname
from topod.discover.numa import parse_meminfo_total
from topod.discover.nvml import normalize_bus_id
from topod.sysnames import (MAX_NUMBER_DIGITS, is_host_bridge, is_hostname, is_pci_address, numbered,
                            split_bus_id)

# The patterns discovery used before (topod 0.x), kept here as the reference.
OLD_CPU = re.compile(r"^cpu(\d+)$")
OLD_HUGE = re.compile(r"^hugepages-(\d{1,9})kB$")
OLD_PCI = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
OLD_PCI_LOWER_8 = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
OLD_BRIDGE = re.compile(r"^pci[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}$")
OLD_BUS_ID = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$")
OLD_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,252})$")
OLD_MEMTOTAL = re.compile(r"MemTotal:\s+(\d+)\s*kB")

# Names built from the pieces that matter, so most examples come near a match.
pieces = st.sampled_from(["cpu", "node", "pci", "hugepages-", "kB", "0", "1", "9", "00", "17", "0000", "a", "F",
                          "ff", ":", ".", "7", "8", "-", "_", " ", "x", "\n", "١", "MemTotal:", "\t"])
names = st.lists(pieces, max_size=9).map("".join)


def _ascii_one_line(text: str) -> bool:
    return text.isascii() and "\n" not in text


@settings(max_examples=600, deadline=None)
@given(names)
@example("cpu12")
@example("cpu12\n")
@example("cpu١")
@example("cpu")
def test_numbered_names_match_the_old_pattern_on_plain_ascii(name):
    old = OLD_CPU.match(name)
    new = numbered(name, "cpu")
    if _ascii_one_line(name):
        assert new == (int(old.group(1)) if old else None)
    else:  # stricter: a newline or a non-ASCII digit is never a CPU number
        assert new is None or (name.isascii() and "\n" not in name)


@settings(max_examples=600, deadline=None)
@given(names)
@example("hugepages-2048kB")
@example("hugepages-0kB")
@example("hugepages-1234567890kB")
def test_hugepage_sizes_match_the_old_pattern(name):
    old = OLD_HUGE.match(name)
    expected = int(old.group(1)) if old and int(old.group(1)) else None
    if _ascii_one_line(name):
        assert parse_hugepage_size(name) == expected
    else:
        assert parse_hugepage_size(name) is None


@settings(max_examples=800, deadline=None)
@given(names)
@example("0000:17:00.0")
@example("0000:17:00.8")
@example("000:17:00.0")
@example("ABCD:ef:1F.7")
@example("0000:17:00.0\n")
@example("0000:17:00.0:1")
@example("00000000:18:00.0")
@example("0000:17")
def test_pci_addresses_match_the_old_patterns(text):
    if _ascii_one_line(text):
        assert is_pci_address(text) == bool(OLD_PCI.match(text))
        assert is_pci_address(text, longest_domain=8, lower=True) == bool(OLD_PCI_LOWER_8.match(text))
        assert is_host_bridge("pci" + text) == bool(OLD_BRIDGE.match("pci" + text))
        assert is_host_bridge(text) == bool(OLD_BRIDGE.match(text))
    else:
        assert not is_pci_address(text)
        assert not is_host_bridge("pci" + text)


@settings(max_examples=600, deadline=None)
@given(names)
@example("00000000:18:00.0")
@example("18:00.0")
@example("123456789:18:00.0")
@example(":18:00.0")
def test_nvml_bus_ids_match_the_old_pattern(text):
    old = OLD_BUS_ID.match(text)
    if _ascii_one_line(text):
        assert split_bus_id(text) == ((old.group(1), old.group(2)) if old else None)
    else:
        assert split_bus_id(text) is None


def test_a_bus_id_is_normalised_to_sysfs_form_and_garbage_is_a_value_error():
    assert normalize_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert normalize_bus_id(" 18:1F.3 ") == "0000:18:1f.3"
    for bad in ("", "18:00", "0000:18:00.8", "123456789:18:00.0", "18:00.0\n0"):
        try:
            normalize_bus_id(bad)
        except ValueError as exc:
            assert "not a PCI bus id" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet="abZ09._-\n é", max_size=12))
@example("a" * 253)
@example("a" * 254)
@example("-host")
@example("host\n")
def test_host_names_match_the_old_pattern(name):
    if _ascii_one_line(name):
        assert is_hostname(name) == bool(OLD_HOSTNAME.match(name))
    else:
        assert not is_hostname(name)
    # parse_hostname takes the first line, stripped: a trailing newline is not part of it
    assert parse_hostname("gpu-node-7\n") == "gpu-node-7"


@settings(max_examples=600, deadline=None)
@given(names)
@example("Node 0 MemTotal:       32768 kB\nNode 0 MemFree: 1 kB\n")
@example("MemTotal:32768 kB")
@example("MemTotal: x\nMemTotal:  5kB")
@example("MemTotal:  12 34 kB")
def test_memtotal_matches_the_old_search(text):
    old = OLD_MEMTOTAL.search(text)
    if text.isascii():
        assert parse_meminfo_total(text) == (int(old.group(1)) * 1024 if old else None)
    elif old is None:
        assert parse_meminfo_total(text) is None


def test_an_absurdly_long_number_is_no_number_not_a_crash():
    # int() raises ValueError past 4,300 digits: such a name is refused, not parsed.
    assert numbered("cpu" + "9" * (MAX_NUMBER_DIGITS + 1), "cpu") is None
    assert numbered("cpu" + "9" * 40, "cpu") == int("9" * 40)
    assert parse_meminfo_total("MemTotal: " + "9" * 5000 + " kB") is None
    assert parse_hugepage_size("hugepages-" + "1" * 10 + "kB") is None  # more than 9 digits, as before


def test_a_tree_with_non_ascii_and_newline_names_discovers_only_the_real_cpus(tmp_path):
    from topod.discover import discover
    from topod.host import HostRoot

    cpu_dir = tmp_path / "sys/devices/system/cpu"
    for name in ("cpu0", "cpu1", "cpu١", "cpu2\n", "cpu" + "9" * 5000):
        try:
            (cpu_dir / name).mkdir(parents=True)
        except OSError:  # a name over the filesystem's limit: nothing to test with it
            pass
    (cpu_dir / "online").write_text("0-1\n")
    topology = discover(HostRoot(str(tmp_path)))
    assert sorted(cpu.id for cpu in topology.cpus) == [0, 1]
