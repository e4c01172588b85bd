"""Which device and class each IRQ gets (pure)."""

from __future__ import annotations

import pytest

from topod.irq.classify import classify_irqs, name_role
from topod.irq.procfs import parse_interrupts
from topod.model import NumaNode, NvlinkFabric, PciDevice, Topology


def _device(address: str, kind: str, names: tuple[str, ...] = (), msi: tuple[int, ...] = ()) -> PciDevice:
    return PciDevice(address, 0x15B3, 0x1021, 0x020700, kind, None, None, "pci0000:00", None, None, 0, 0,
                     "firmware", (0, 1), None, msi, names)


TOPOLOGY = Topology(
    root="/", numa_nodes=(NumaNode(0, (0, 1), {0: 10}, None),), cpus=(), gpus=(), nvlink=NvlinkFabric(), warnings=(),
    pci_devices=(
        _device("0000:14:00.0", "rdma", ("mlx5_0", "ibp0s0")),
        _device("0000:19:00.0", "nvme", ("nvme0",)),
        _device("0000:20:00.0", "nic", ("ens1f0",)),
        _device("0000:21:00.0", "nic", ("eno1",)),
        _device("0000:13:00.0", "gpu", ("card1",), msi=(40,)),
        _device("0000:22:00.0", "nic", (), msi=(41,)),
    ),
)


def _classify(lines: str):
    return classify_irqs(TOPOLOGY, parse_interrupts("   CPU0\n" + lines))


def test_mlx5_completion_vectors_are_rdma_queues_by_their_pci_address():
    info = _classify(" 30: 0 IR-PCI-MSIX 3-edge mlx5_comp3@pci:0000:14:00.0\n")[30]
    assert (info.device, info.irq_class, info.role, info.queue, info.source) == ("0000:14:00.0", "rdma", "queue", 3, "name")


def test_mlx5_async_vector_is_a_control_vector():
    info = _classify(" 31: 0 IR-PCI-MSIX 0-edge mlx5_async0@pci:0000:14:00.0\n")[31]
    assert info.role == "control" and info.device == "0000:14:00.0"


def test_nvme_admin_queue_maps_through_the_controller_name():
    irqs = _classify(" 32: 0 IR-PCI-MSI 0-edge nvme0q0\n 33: 0 IR-PCI-MSI 1-edge nvme0q1\n")
    assert irqs[32].device == "0000:19:00.0" and irqs[32].role == "control"
    assert irqs[33].role == "queue" and irqs[33].queue == 0 and irqs[33].irq_class == "nvme"


@pytest.mark.parametrize(("name", "device", "queue"), [
    ("ice-ens1f0-TxRx-4", "0000:20:00.0", 4),
    ("i40e-ens1f0-TxRx-2", "0000:20:00.0", 2),
    ("eno1-TxRx-1", "0000:21:00.0", 1),  # bnxt_en
])
def test_nic_queue_vectors_map_through_the_netdev_name(name, device, queue):
    info = _classify(f" 34: 0 IR-PCI-MSI 0-edge {name}\n")[34]
    assert (info.device, info.irq_class, info.queue) == (device, "nic", queue)


def test_ice_misc_vector_maps_by_address_and_is_control():
    info = _classify(" 35: 0 IR-PCI-MSIX 0-edge ice-0000:20:00.0:misc\n")[35]
    assert info.device == "0000:20:00.0" and info.role == "control" and info.irq_class == "nic"


def test_msi_irqs_directory_wins_over_the_name():
    info = _classify(" 40: 0 IR-PCI-MSIX 0-edge mlx5_comp0@pci:0000:14:00.0\n")[40]
    assert info.device == "0000:13:00.0" and info.irq_class == "gpu" and info.source == "msi_irqs"


def test_chip_address_is_the_last_resort():
    info = _classify(" 42: 0 IR-PCI-MSIX-0000:22:00.0 0-edge something\n")[42]
    assert info.device == "0000:22:00.0" and info.source == "chip"


def test_an_irq_nothing_ties_to_a_device_is_other():
    info = _classify(" 0: 0 IO-APIC 2-edge timer\n 9: 0 IO-APIC 9-fasteoi\n")
    assert info[0].device is None and info[0].irq_class == "other" and info[9].irq_class == "other"


def test_a_known_name_pattern_without_a_device_keeps_its_class_but_no_device():
    info = _classify(" 50: 0 c 0-edge mlx5_comp1@pci:0000:99:00.0\n")[50]
    assert info.device is None and info.irq_class == "rdma"


def test_queue_vectors_sort_before_control_vectors_in_queue_order():
    assert name_role("mlx5_comp7@pci:x") == ("queue", 7, "rdma")
    irqs = _classify(" 60: 0 c 0-edge mlx5_async0@pci:0000:14:00.0\n 61: 0 c 1-edge mlx5_comp1@pci:0000:14:00.0\n"
                     " 62: 0 c 2-edge mlx5_comp0@pci:0000:14:00.0\n")
    assert sorted(irqs, key=lambda i: irqs[i].sort_key) == [62, 61, 60]
