"""The pure half of topod.discover.udev and topod.discover.udev_check: path parsing, the
sysfs/udev comparison, the debouncer, settings, and what happens off the live root (no
pyudev needed)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from topod.discover import discover
from topod.discover.udev import NOT_LIVE, ChangeDebouncer, UdevEvent, UdevSettings, nearest_pci_address, start_watcher
from topod.discover.udev_check import UdevDevice, compare, cross_check, direct_pci_parent
from topod.errors import ConfigError
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec

FN = "/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    """Built host trees and their Topology, once per module (both are only read here)."""
    cache: dict[str, tuple[HostRoot, object]] = {}

    def make(name: str):
        if name not in cache:
            host = HostRoot(build_host(load_builtin_spec(name), tmp_path_factory.mktemp(name)))
            cache[name] = (host, discover(host, live_nvml=False))
        return cache[name]

    return make


@pytest.fixture()
def topology_of(built):
    return lambda name: built(name)[1]


def udev_view(topology) -> list[UdevDevice]:
    """What udev would list for a host whose sysfs discovery produced `topology`."""
    devices = []
    for d in topology.pci_devices:
        path = f"/sys/devices/{d.root_complex}/{d.address}"
        devices.append(UdevDevice("pci", path, d.address, d.address, d.vendor, d.device, d.class_code,
                                  d.driver, d.numa_node_raw))
        for name in d.names:
            subsystem = "infiniband" if name.startswith("mlx5_") else "nvme" if name.startswith("nvme") else (
                "drm" if name.startswith("card") else "net")
            devices.append(UdevDevice(subsystem, f"{path}/{subsystem}/{name}", name, d.address))
    return devices


def replaced(devices: list[UdevDevice], address: str, **changes) -> list[UdevDevice]:
    return [dataclasses.replace(d, **changes) if d.subsystem == "pci" and d.address == address else d
            for d in devices]


def test_direct_pci_parent_of_a_netdev_is_its_function():
    assert direct_pci_parent(f"{FN}/net/ibp24s0", "net") == "0000:18:00.0"
    assert direct_pci_parent(f"{FN}/infiniband/mlx5_0", "infiniband") == "0000:18:00.0"


def test_direct_pci_parent_is_none_for_virtual_and_nested_devices():
    assert direct_pci_parent("/sys/devices/virtual/net/lo", "net") is None
    assert direct_pci_parent(f"{FN}/drm/card1/card1-DP-1", "drm") is None  # a connector, not a card
    assert direct_pci_parent("/sys/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/net/eth1", "net") is None


def test_nearest_pci_address_walks_up_to_the_function():
    assert nearest_pci_address(f"{FN}/infiniband/mlx5_0") == "0000:18:00.0"
    assert nearest_pci_address(FN) == "0000:18:00.0"
    assert nearest_pci_address("/sys/devices/virtual/net/docker0") is None


def test_compare_of_agreeing_views_finds_nothing(topology_of):
    topology = topology_of("h800-8gpu")
    assert compare(topology, udev_view(topology)) == ()


def test_compare_reports_a_function_only_udev_lists(topology_of):
    topology = topology_of("h800-8gpu")
    extra = UdevDevice("pci", "/sys/devices/pci0000:f0/0000:f0:00.0", "0000:f0:00.0", "0000:f0:00.0",
                       0x10DE, 0x2324, 0x030200, "nvidia", 0)
    (finding,) = compare(topology, udev_view(topology) + [extra])
    assert finding.code == "udev_mismatch" and finding.path == "sys/bus/pci/devices/0000:f0:00.0"
    assert finding.reason == ("udev lists PCI function 0000:f0:00.0 (vendor 0x10de device 0x2324 class "
                              "0x030200 driver nvidia) but sysfs discovery did not find it")


def test_compare_reports_a_function_udev_misses_once_not_per_child(topology_of):
    topology = topology_of("h800-8gpu")
    nic = topology.devices_of_kind("rdma")[0].address
    view = [d for d in udev_view(topology) if d.address != nic]
    (finding,) = compare(topology, view)
    assert finding.path == f"sys/bus/pci/devices/{nic}"
    assert finding.reason == f"sysfs discovery found PCI function {nic} (kind rdma) but udev does not list it"


def test_compare_names_every_field_that_differs(topology_of):
    topology = topology_of("h800-8gpu")
    gpu = topology.gpus[0].address
    (finding,) = compare(topology, replaced(udev_view(topology), gpu, driver="vfio-pci", numa_node=1))
    assert finding.reason == (f"PCI function {gpu}: driver is nvidia in sysfs discovery but vfio-pci in udev; "
                              "numa_node is 0 in sysfs discovery but 1 in udev")


def test_compare_reports_ids_in_hex(topology_of):
    topology = topology_of("vm-nogpu")
    nvme = topology.devices_of_kind("nvme")[0].address
    (finding,) = compare(topology, replaced(udev_view(topology), nvme, class_code=0x010601))
    assert "class is 0x010802 in sysfs discovery but 0x010601 in udev" in finding.reason


def test_compare_reports_a_child_only_udev_lists(topology_of):
    topology = topology_of("h800-8gpu")
    nic = topology.devices_of_kind("rdma")[0]
    path = f"/sys/devices/{nic.root_complex}/{nic.address}/infiniband/mlx5_99"
    (finding,) = compare(topology, udev_view(topology) + [UdevDevice("infiniband", path, "mlx5_99", nic.address)])
    assert finding.path == path.lstrip("/")
    assert "udev lists infiniband device mlx5_99 under PCI function" in finding.reason


def test_compare_reports_a_child_udev_does_not_list(topology_of):
    topology = topology_of("h800-8gpu")
    nvme = topology.devices_of_kind("nvme")[0]
    view = [d for d in udev_view(topology) if not (d.subsystem == "nvme" and d.address == nvme.address)]
    (finding,) = compare(topology, view)
    assert finding.path == f"sys/bus/pci/devices/{nvme.address}"
    assert f"sysfs discovery records {nvme.names[0]} under PCI function {nvme.address}" in finding.reason


def test_compare_ignores_children_without_a_pci_function(topology_of):
    topology = topology_of("vm-nogpu")
    lo = UdevDevice("net", "/sys/devices/virtual/net/lo", "lo", None)
    assert compare(topology, udev_view(topology) + [lo]) == ()


def event(action: str, address: str | None = "0000:18:00.0") -> UdevEvent:
    return UdevEvent(action, "pci", "/sys/devices/x", address)


def test_debouncer_turns_a_burst_into_one_request_after_quiet():
    debouncer = ChangeDebouncer(quiet_s=0.5, max_delay_s=5.0)
    for t in (0.0, 0.1, 0.2, 0.3):
        debouncer.add([event("add"), event("bind", "0000:19:00.0")], now=t)
        assert debouncer.take(t) is None
    assert debouncer.deadline() == pytest.approx(0.8)
    request = debouncer.take(0.8)
    assert (request.events, request.actions, request.addresses) == (8, ("add", "bind"),
                                                                     ("0000:18:00.0", "0000:19:00.0"))
    assert debouncer.take(10.0) is None and debouncer.deadline() is None


def test_debouncer_forces_a_request_when_events_never_stop():
    debouncer = ChangeDebouncer(quiet_s=0.5, max_delay_s=2.0)
    requests = []
    for step in range(50):  # an event every 0.1 s for 5 s
        now = step * 0.1
        debouncer.add([event("change")], now=now)
        if (request := debouncer.take(now)) is not None:
            requests.append(request)
    assert [(round(r.first_at, 1), round(r.last_at, 1), r.events) for r in requests] == [
        (0.0, 2.0, 21), (2.1, 4.1, 21)]


def test_debouncer_ignores_actions_that_do_not_change_topology():
    debouncer = ChangeDebouncer()
    debouncer.add([event("online"), event("offline")], now=0.0)
    assert debouncer.deadline() is None


def test_debouncer_rejects_a_quiet_period_longer_than_the_cap():
    with pytest.raises(ValueError, match="quiet_s <= max_delay_s"):
        ChangeDebouncer(quiet_s=3.0, max_delay_s=1.0)


def test_settings_reject_an_unknown_source_by_name():
    with pytest.raises(ConfigError, match=r"\[udev\] source = 'netlink': must be \"udev\" or \"kernel\""):
        UdevSettings(source="netlink")


def test_settings_reject_negative_quiet():
    with pytest.raises(ConfigError, match="quiet_s = -1"):
        UdevSettings(quiet_s=-1)


def test_cross_check_off_the_live_root_says_udev_is_not_used(built):
    host, topology = built("h800-8gpu")
    check = cross_check(host, topology)
    assert (check.used, check.status, check.findings) == (False, NOT_LIVE, ())
    assert NOT_LIVE == "udev: not used for non-live root"


def test_watcher_is_not_started_off_the_live_root_or_when_disabled(built):
    host, _ = built("vm-nogpu")
    assert start_watcher(host) == (None, NOT_LIVE)
    assert start_watcher(HostRoot("/"), UdevSettings(enabled=False)) == (None, "udev: disabled by [udev] enabled = false")


def test_udev_module_does_not_import_pyudev_until_used(built):
    root = built("vm-nogpu")[0].root
    code = (
        "import sys; from topod.discover import discover; from topod.host import HostRoot; "
        "from topod.discover.udev import start_watcher; from topod.discover.udev_check import cross_check; "
        f"h = HostRoot({str(root)!r}); cross_check(h, discover(h, live_nvml=False)); start_watcher(h); "
        "print('pyudev' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
