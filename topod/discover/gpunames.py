"""Who made a GPU and what it is called, from its PCI ids, where no driver library says.

NVML names NVIDIA GPUs and KFD (topod.discover.kfd) AMD ones; a GPU found by PCI alone
(no NVML, no KFD: a captured tree, a driver not loaded) still gets a vendor and a model.
"""

from __future__ import annotations

from topod.discover.kfd import AMD_MODELS, AMD_VENDOR

VENDORS = {0x10DE: "nvidia", AMD_VENDOR: "amd", 0x8086: "intel"}
VENDOR_TITLES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}


def gpu_vendor(vendor_id: int | None) -> str | None:
    """0x10de -> 'nvidia', 0x1002 -> 'amd'; an unknown vendor as its id in hex."""
    if vendor_id is None:
        return None
    return VENDORS.get(vendor_id, f"0x{vendor_id:04x}")


def pci_model(vendor_id: int | None, device_id: int | None) -> str | None:
    """AMD's marketing name from the device id table, else '<Vendor> <vendor>:<device>'."""
    if vendor_id == AMD_VENDOR and device_id in AMD_MODELS:
        return AMD_MODELS[device_id]
    if vendor_id is None or device_id is None:
        return None
    title = VENDOR_TITLES.get(VENDORS.get(vendor_id, ""), "PCI")
    return f"{title} {vendor_id:04x}:{device_id:04x}"
