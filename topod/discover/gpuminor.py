"""GPU device minors: the N of /dev/nvidiaN, which need not be NVML's index.

The driver numbers its character devices in probe order and says which is which in
/proc/driver/nvidia/gpus/<bdf>/information ("Device Minor: N"); NVML says the same through
nvmlDeviceGetMinorNumber (kept as `minor_number` in nvml.json). Slurm's gres.conf File=,
cgroup device fencing and doctor's fd -> GPU mapping need the minor, never the index.
"""

from __future__ import annotations

from collections.abc import Mapping

from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import Gpu
from topod.record import replace
from topod.sysnames import is_pci_address

DRIVER_GPUS_DIR = "proc/driver/nvidia/gpus"


def parse_device_minor(text: str) -> int | None:
    """The 'Device Minor:' value of a driver information file; None when the line is
    absent; ValueError when it is there but not a non-negative integer."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "device minor":
            value = value.strip()
            if not value.isdigit() or len(value) > 9:
                raise ValueError(f"Device Minor {value[:20]!r} is not a non-negative integer")
            return int(value)
    return None


def read_driver_minors(host: HostRoot, notes: Notes | None = None) -> dict[str, int]:
    """PCI address (sysfs form, lower case) -> device minor, from the driver's files.

    Empty when the driver is absent (no GPU, captured trees without /proc/driver)."""
    minors: dict[str, int] = {}
    for name in host.listdir(DRIVER_GPUS_DIR):
        address = name.lower()
        if not is_pci_address(address, longest_domain=8, lower=True):
            continue
        if len(address.split(":")[0]) > 4:  # an NVML-style 8-digit domain
            address = f"{int(address.split(':')[0], 16):04x}:{address.split(':', 1)[1]}"
        rel = f"{DRIVER_GPUS_DIR}/{name}/information"
        text = host.read(rel)
        if text is None:
            continue
        try:
            minor = parse_device_minor(text)
        except ValueError as exc:
            if notes is not None:
                notes.add("bad_value", rel, f"{exc}; ignored")
            continue
        if minor is not None:
            minors[address] = minor
    return minors


def assign_minors(
    gpus: list[Gpu],
    driver: Mapping[str, int],
    nvml: Mapping[str, int],
    notes: Notes,
) -> list[Gpu]:
    """Each GPU with its minor: the driver's file first, else NVML's; GPUs left without
    one get minor None and one `gpu_minor_unknown` warning naming them (exports then
    fall back to the index, and say so)."""
    out, unknown = [], []
    for gpu in gpus:
        minor = driver.get(gpu.address)
        from_nvml = nvml.get(gpu.address)
        if minor is not None and from_nvml is not None and minor != from_nvml:
            notes.add("gpu_minor_mismatch", f"{DRIVER_GPUS_DIR}/{gpu.address}/information",
                      f"GPU {gpu.index}: driver says minor {minor}, NVML says {from_nvml}; used the driver's")
        if minor is None:
            minor = from_nvml
        if minor is None:
            unknown.append(gpu.index)
        out.append(replace(gpu, minor=minor))
    seen: dict[int, int] = {}
    for gpu in out:
        if gpu.minor is None:
            continue
        if gpu.minor in seen:
            notes.add("gpu_minor_duplicate", DRIVER_GPUS_DIR,
                      f"GPUs {seen[gpu.minor]} and {gpu.index} both claim minor {gpu.minor}")
        seen.setdefault(gpu.minor, gpu.index)
    if unknown:
        listed = ",".join(str(i) for i in unknown)
        notes.add("gpu_minor_unknown", DRIVER_GPUS_DIR,
                  f"no device minor for GPU(s) {listed} (no {DRIVER_GPUS_DIR}/<bdf>/information and no NVML "
                  "minor number): /dev/nvidiaN is taken to be the NVML index, which the driver does not "
                  "promise; check with `ls -l /dev/nvidia*` against nvidia-smi -q")
    return out


def with_minors(host: HostRoot, gpus: list[Gpu], nvml: Mapping[str, int], notes: Notes) -> list[Gpu]:
    """assign_minors with the driver's files read from host (no GPUs: nothing read). AMD
    GPUs have no /dev/nvidiaN and are left as they are (their render node is KFD's)."""
    nvidia = [gpu for gpu in gpus if gpu.vendor != "amd"]
    if not nvidia:
        return gpus
    assigned = {gpu.index: gpu for gpu in assign_minors(nvidia, read_driver_minors(host, notes), nvml, notes)}
    return [assigned.get(gpu.index, gpu) for gpu in gpus]
