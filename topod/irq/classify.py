"""Which device each IRQ belongs to, and what class of IRQ it is (pure).

The device comes from the strongest evidence first: the PCI function's msi_irqs/
directory (the kernel's own list), then the name the driver gave the vector in
/proc/interrupts (mlx5_comp3@pci:ADDR, nvme0q2, ice-ens1f0-TxRx-4, ...), then the
MSI chip column, which on recent kernels carries the address (IR-PCI-MSIX-ADDR).
"""

from __future__ import annotations

import re

from topod.irq.procfs import Interrupts, InterruptLine
from topod.model import PciDevice, Topology
from topod.record import record

IRQ_CLASSES = ("rdma", "nic", "nvme", "gpu", "other")
_KIND_CLASS = {"rdma": "rdma", "nic": "nic", "nvme": "nvme", "gpu": "gpu", "nvswitch": "gpu"}

_PCI_ADDR = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_AT_PCI = re.compile(rf"@pci:({_PCI_ADDR})")
_CHIP_ADDR = re.compile(rf"-({_PCI_ADDR})$")
_MLX5 = re.compile(r"^mlx5_(comp|async|ctrl)(\d+)@")
_NVME = re.compile(r"^(nvme\d+)q(\d+)$")
# ice-/i40e-: '<drv>-<addr>:misc' or '<drv>-<netdev>-TxRx-<q>'; bnxt_en and others:
# '<netdev>-TxRx-<q>', '<netdev>-rx-<q>', '<netdev>-tx-<q>'.
_ADDR_MISC = re.compile(rf"^(ice|i40e|iavf|ixgbe)-({_PCI_ADDR}):misc$")
_NETDEV_QUEUE = re.compile(r"^(?:(?:ice|i40e|iavf)-)?(\S+?)-(TxRx|rx|tx|fp)-(\d+)$")


@record
class IrqInfo:
    irq: int
    name: str | None
    device: str | None  # PCI address, None when nothing ties it to a device
    irq_class: str  # rdma | nic | nvme | gpu | other
    role: str  # queue | control (async/admin/misc vectors)
    queue: int | None  # queue index, the order queues are spread in
    source: str  # msi_irqs | name | chip | none

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Queues in queue order first, then control vectors (mlx5 scripts do the same)."""
        return (0 if self.role == "queue" else 1, self.queue if self.queue is not None else 0, self.irq)


def classify_irqs(topology: Topology, interrupts: Interrupts) -> dict[int, IrqInfo]:
    """Every numbered IRQ in /proc/interrupts, classified."""
    by_msi = {irq: device for device in topology.pci_devices for irq in device.msi_irqs}
    by_name = _names_index(topology)
    return {irq: classify_line(line, by_msi, by_name, topology) for irq, line in interrupts.lines.items()}


def _names_index(topology: Topology) -> dict[str, PciDevice]:
    index: dict[str, PciDevice] = {}
    for device in topology.pci_devices:
        for name in device.names:
            index[name] = device
    return index


def classify_line(line: InterruptLine, by_msi: dict[int, PciDevice], by_name: dict[str, PciDevice],
                  topology: Topology) -> IrqInfo:
    role, queue, name_class = name_role(line.name)
    device, source = by_msi.get(line.irq), "msi_irqs"
    if device is None:
        device, source = _device_from_name(line.name, by_name, topology), "name"
    if device is None and line.chip:
        match = _CHIP_ADDR.search(line.chip)
        device, source = (topology.device(match.group(1).lower()) if match else None), "chip"
    if device is None:
        return IrqInfo(line.irq, line.name, None, name_class or "other", role, queue, "none")
    irq_class = _KIND_CLASS.get(device.kind) or name_class or "other"
    return IrqInfo(line.irq, line.name, device.address, irq_class, role, queue, source)


def name_role(name: str | None) -> tuple[str, int | None, str | None]:
    """(role, queue index, class the name implies) from a vector's name."""
    if not name:
        return "queue", None, None
    if match := _MLX5.match(name):
        kind, number = match.group(1), int(match.group(2))
        return ("queue", number, "rdma") if kind == "comp" else ("control", None, "rdma")
    if match := _NVME.match(name):
        q = int(match.group(2))
        # q0 is the admin queue; I/O queues start at q1.
        return ("control", None, "nvme") if q == 0 else ("queue", q - 1, "nvme")
    if _ADDR_MISC.match(name) or name.endswith(":misc") or name.endswith("-misc"):
        return "control", None, "nic"
    if match := _NETDEV_QUEUE.match(name):
        return "queue", int(match.group(3)), "nic"
    return "queue", None, None


def _device_from_name(name: str | None, by_name: dict[str, PciDevice], topology: Topology) -> PciDevice | None:
    if not name:
        return None
    if match := _AT_PCI.search(name):
        return topology.device(match.group(1).lower())
    if match := _NVME.match(name):
        return by_name.get(match.group(1))  # nvme0q0 -> the controller named nvme0
    if match := _ADDR_MISC.match(name):
        return topology.device(match.group(2).lower())
    if match := _NETDEV_QUEUE.match(name):
        return by_name.get(match.group(1))
    return by_name.get(name)
