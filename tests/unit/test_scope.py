"""topod.scope: the per-lease scope's name and StartTransientUnit properties (pure), and
the bus half's answer where there is no system bus."""

from __future__ import annotations

import pytest

from topod.host import HostRoot
from topod.scope import ScopeError, ScopeSpec, bitmask, control_nodes, device_allow, scope_properties, start_scope, \
    unit_name


def _spec(**changes) -> ScopeSpec:
    fields = dict(lease_id="0123456789abcdef", pid=4242, cpus=(8, 9, 10, 11), memory_nodes=(1,),
                  gpu_numbers=(3,), controls=("/dev/nvidiactl", "/dev/nvidia-uvm"), job="train")
    fields.update(changes)
    return ScopeSpec(**fields)


def test_cpu_n_is_bit_n_mod_8_of_byte_n_div_8_least_significant_first():
    assert bitmask([0]) == b"\x01"
    assert bitmask([7]) == b"\x80"
    assert bitmask([8]) == b"\x00\x01"
    assert bitmask([0, 1, 2, 3]) == b"\x0f"
    assert bitmask([4, 5, 6, 7, 8, 9]) == b"\xf0\x03"
    assert bitmask([63]) == bytes(7) + b"\x80"
    assert bitmask([1, 1, 1]) == b"\x02", "a repeated id is one bit"
    assert bitmask([]) == b""


def test_bitmask_round_trips_to_the_ids_for_a_sparse_set():
    ids = {0, 5, 17, 64, 65, 127, 200}
    mask = bitmask(ids)
    assert len(mask) == 200 // 8 + 1, "no trailing zero bytes"
    assert {byte * 8 + bit for byte, value in enumerate(mask) for bit in range(8) if value >> bit & 1} == ids


def test_a_negative_id_is_refused():
    with pytest.raises(ValueError):
        bitmask([-1, 2])


def test_unit_name_is_the_lease_scope_and_escapes_what_a_unit_name_cannot_hold():
    assert unit_name("0123456789abcdef") == "topod-lease-0123456789abcdef.scope"
    assert unit_name("a/b c") == "topod-lease-a\\x2fb\\x20c.scope"
    assert unit_name("a/b") != unit_name("a_b")


def test_device_allow_lists_the_leased_gpus_then_the_control_nodes_rw():
    assert device_allow([5, 3], ["/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1"]) == [
        ("/dev/nvidia3", "rw"), ("/dev/nvidia5", "rw"), ("/dev/nvidiactl", "rw"),
        ("/dev/nvidia-caps/nvidia-cap1", "rw")]
    assert device_allow([], []) == [], "no GPU: closed admits only systemd's standard pseudo devices"


def test_properties_carry_pid_cpus_nodes_and_a_closed_device_policy():
    props = dict(scope_properties(_spec()))
    assert props["PIDs"] == ("au", [4242])
    assert props["AllowedCPUs"] == ("ay", b"\x00\x0f")
    assert props["AllowedMemoryNodes"] == ("ay", b"\x02")
    assert props["DevicePolicy"] == ("s", "closed")
    assert props["DeviceAllow"] == ("a(ss)", [("/dev/nvidia3", "rw"), ("/dev/nvidiactl", "rw"),
                                              ("/dev/nvidia-uvm", "rw")])
    assert props["Description"] == ("s", "topod lease 0123456789abcdef (train)")
    # not under system.slice, which live isolation narrows to the housekeeping CPUs
    assert props["Slice"] == ("s", "topod.slice")
    # every value is (signature, value): what jeepney sends as a variant
    assert all(isinstance(sig, str) and sig for sig, _ in props.values())


def test_a_lease_without_cpus_or_nodes_sets_no_mask_since_empty_means_unrestricted():
    props = dict(scope_properties(_spec(cpus=(), memory_nodes=())))
    assert "AllowedCPUs" not in props and "AllowedMemoryNodes" not in props
    assert props["DevicePolicy"] == ("s", "closed")


def test_control_nodes_are_read_through_the_host_root(tmp_path):
    for rel in ("sys", "proc", "dev/nvidia-caps"):
        (tmp_path / rel).mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm-tools", "nvidia0", "nvidia-caps/nvidia-cap2", "nvidia-caps/nvidia-cap1"):
        (tmp_path / "dev" / name).write_text("")
    assert control_nodes(HostRoot(tmp_path)) == ["/dev/nvidiactl", "/dev/nvidia-uvm-tools",
                                                  "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    empty = tmp_path / "empty"
    for rel in ("sys", "proc", "dev"):
        (empty / rel).mkdir(parents=True)
    assert control_nodes(HostRoot(empty)) == []


def test_no_system_bus_is_a_scope_error_that_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus")
    with pytest.raises(ScopeError, match="no system bus"):
        start_scope(_spec(), timeout=2)
