"""GPU facts from NVML: live through pynvml, or from the nvml.json a snapshot carries."""

from __future__ import annotations

import functools
import json

from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.discover.fabric import GpuExtras, live_extras, parse_extras
from topod.model import NvLink, NvlinkFabric
from topod.record import record
from topod.sysnames import split_bus_id

TYPE_CHECKING = False  # typing costs ~3 ms of every topoctl start; annotations are never evaluated
if TYPE_CHECKING:
    from typing import Any

NVML_FILE = "nvml.json"
REMOTE_TYPES = ("gpu", "switch", "cpu")


@record
class NvmlGpu:
    index: int
    pci_bus_id: str
    uuid: str | None
    name: str | None
    memory_total_mib: int | None
    compute_capability: tuple[int, int] | None
    nvlinks: tuple[NvLink, ...]
    extras: GpuExtras = GpuExtras()  # memory NUMA node, C2C, multi-node fabric
    minor_number: int | None = None  # nvmlDeviceGetMinorNumber: N of /dev/nvidiaN


@record
class NvmlReport:
    source: str  # nvml-live | nvml-file
    driver_version: str | None
    gpus: tuple[NvmlGpu, ...]


def normalize_bus_id(bus_id: str) -> str:
    """NVML's '00000000:18:00.0' -> sysfs's '0000:18:00.0' (lower case); ValueError otherwise."""
    parts = split_bus_id(bus_id.strip().lower())
    if parts is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return f"{int(parts[0] or '0', 16):04x}:{parts[1]}"


@functools.lru_cache(maxsize=1)
def parse_nvml_json(text: str) -> NvmlReport:
    """Parse nvml.json; raises ValueError naming the first bad field. The report is
    immutable, so a rescan of an unchanged file reuses the last one (a failure is never
    kept: it is raised again)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # an integer of 5,000 digits; nesting 1,000 deep
        raise ValueError(f"not JSON topod can read: {str(exc)[:80]}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("expected an object with a 'gpus' list")
    gpus = tuple(_parse_gpu(entry, position) for position, entry in enumerate(data["gpus"]))
    driver = data.get("driver_version")
    if driver is not None and not isinstance(driver, str):
        raise ValueError("driver_version: expected a string")
    return NvmlReport(source="nvml-file", driver_version=driver, gpus=gpus)


def _parse_gpu(entry: Any, position: int) -> NvmlGpu:
    where = f"gpus[{position}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object")
    index = entry.get("index")
    bus_id = entry.get("pci_bus_id")
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"{where}.index: expected a non-negative integer")
    if not isinstance(bus_id, str):
        raise ValueError(f"{where}.pci_bus_id: expected a string")
    try:
        address = normalize_bus_id(bus_id)
    except ValueError as exc:
        raise ValueError(f"{where}.pci_bus_id: {bus_id!r} is not a PCI address") from exc
    capability = entry.get("compute_capability")
    if capability is not None:
        if not (isinstance(capability, list) and len(capability) == 2 and all(isinstance(v, int) for v in capability)):
            raise ValueError(f"{where}.compute_capability: expected [major, minor]")
        capability = (capability[0], capability[1])
    memory = entry.get("memory_total_mib")
    if memory is not None and not isinstance(memory, int):
        raise ValueError(f"{where}.memory_total_mib: expected an integer")
    nvlinks = entry.get("nvlinks") or []
    if not isinstance(nvlinks, list):
        raise ValueError(f"{where}.nvlinks: expected a list")
    links = tuple(_parse_link(link, f"{where}.nvlinks[{i}]") for i, link in enumerate(nvlinks))
    return NvmlGpu(
        index=index,
        pci_bus_id=address,
        uuid=entry.get("uuid") if isinstance(entry.get("uuid"), str) else None,
        name=entry.get("name") if isinstance(entry.get("name"), str) else None,
        memory_total_mib=memory,
        compute_capability=capability,
        nvlinks=links,
        extras=parse_extras(entry, where, entry.get("name") if isinstance(entry.get("name"), str) else None),
        minor_number=parse_minor_number(entry, where),
    )


def _parse_link(entry: Any, where: str) -> NvLink:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object")
    kind = entry.get("remote_device_type")
    if kind not in REMOTE_TYPES:
        raise ValueError(f"{where}.remote_device_type: expected one of {', '.join(REMOTE_TYPES)}")
    remote = entry.get("remote_pci_bus_id")
    if not isinstance(remote, str):
        raise ValueError(f"{where}.remote_pci_bus_id: expected a string")
    link = entry.get("link")
    if not isinstance(link, int):
        raise ValueError(f"{where}.link: expected an integer")
    try:
        remote_id = normalize_bus_id(remote)
    except ValueError as exc:
        raise ValueError(f"{where}.remote_pci_bus_id: {exc}") from exc
    return NvLink(link=link, active=bool(entry.get("active")), remote_pci_bus_id=remote_id,
                  remote_device_type=kind)


def read_nvml(host: HostRoot, notes: Notes, *, allow_live: bool = True, expect_gpus: bool = True) -> NvmlReport | None:
    """Live NVML on the real root, else nvml.json at the root, else None (noted)."""
    if host.is_live and allow_live and expect_gpus:
        report = read_live_nvml(notes)
        if report is not None:
            return without_duplicates(report, notes)
    text = host.read(NVML_FILE)
    if text is None:
        if not expect_gpus:
            return None
        notes.add("no_nvml", NVML_FILE, "no NVML driver and no nvml.json: GPU names, UUIDs and NVLink unknown")
        return None
    try:
        return without_duplicates(parse_nvml_json(text), notes)
    except ValueError as exc:
        notes.add("bad_value", NVML_FILE, f"ignored: {exc}")
        return None


def without_duplicates(report: NvmlReport, notes: Notes) -> NvmlReport:
    """The report less every GPU whose index or PCI address an earlier entry already
    has, each one a `duplicate_gpu` warning: two GPUs under one index would make one lease
    name two devices, so the later one is not offered (never merged, never renumbered)."""
    kept: list[NvmlGpu] = []
    indices: dict[int, str] = {}
    addresses: dict[str, int] = {}
    for position, gpu in enumerate(report.gpus):
        if gpu.index in indices:
            notes.add("duplicate_gpu", f"{NVML_FILE}:gpus[{position}]",
                      f"GPU index {gpu.index} ({gpu.pci_bus_id}) is already GPU {gpu.index} "
                      f"({indices[gpu.index]}); this one is not offered")
            continue
        if gpu.pci_bus_id in addresses:
            notes.add("duplicate_gpu", f"{NVML_FILE}:gpus[{position}]",
                      f"GPU {gpu.index} has the PCI address {gpu.pci_bus_id} of GPU {addresses[gpu.pci_bus_id]}; "
                      "this one is not offered")
            continue
        indices[gpu.index] = gpu.pci_bus_id
        addresses[gpu.pci_bus_id] = gpu.index
        kept.append(gpu)
    if len(kept) == len(report.gpus):
        return report
    return NvmlReport(source=report.source, driver_version=report.driver_version, gpus=tuple(kept))


def read_live_nvml(notes: Notes) -> NvmlReport | None:
    try:
        import pynvml  # lazy: nvidia-ml-py costs import time and most commands never need it
    except ImportError:
        notes.add("no_nvml", "pynvml", "nvidia-ml-py is not installed")
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        notes.add("no_nvml", "libnvidia-ml.so", f"NVML unavailable: {exc}")
        return None
    try:
        return _live_report(pynvml)
    except (pynvml.NVMLError, ValueError) as exc:
        notes.add("nvml_error", "libnvidia-ml.so", f"NVML query failed: {exc}")
        return None
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _live_report(pynvml: Any) -> NvmlReport:
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pci = pynvml.nvmlDeviceGetPciInfo(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            capability: tuple[int, int] | None = (major, minor)
        except pynvml.NVMLError:
            capability = None
        gpus.append(
            NvmlGpu(
                index=index,
                pci_bus_id=normalize_bus_id(_text(pci.busId)),
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                memory_total_mib=int(memory.total) // (1024 * 1024),
                compute_capability=capability,
                nvlinks=tuple(_live_links(pynvml, handle)),
                extras=live_extras(pynvml, handle, _text(pynvml.nvmlDeviceGetName(handle))),
                minor_number=live_minor_number(pynvml, handle),
            )
        )
    return NvmlReport(source="nvml-live", driver_version=_text(pynvml.nvmlSystemGetDriverVersion()), gpus=tuple(gpus))


def _live_links(pynvml: Any, handle: Any) -> list[NvLink]:
    links = []
    type_names = {0: "gpu", 1: "cpu", 2: "switch"}  # NVML_NVLINK_DEVICE_TYPE_{GPU,IBMNPU,SWITCH}
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            continue  # the link does not exist on this GPU
        try:
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            remote_id = normalize_bus_id(_text(remote.busId))
            remote_type = type_names.get(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link), "gpu")
        except (pynvml.NVMLError, AttributeError):
            continue
        links.append(NvLink(link=link, active=bool(state), remote_pci_bus_id=remote_id, remote_device_type=remote_type))
    return links


def build_fabric(report: NvmlReport | None, index_of_address: dict[str, int]) -> NvlinkFabric:
    """Direct links per GPU pair, and NVSwitch islands (GPUs sharing a switch are
    all-to-all, each with its own link count)."""
    if report is None:
        return NvlinkFabric()
    pair_counts: dict[tuple[int, int], dict[int, int]] = {}
    switch_links: dict[int, int] = {}
    switches_of: dict[int, set[str]] = {}
    for gpu in report.gpus:
        for link in gpu.nvlinks:
            if not link.active:
                continue
            if link.remote_device_type == "gpu":
                peer = index_of_address.get(link.remote_pci_bus_id)
                if peer is None or peer == gpu.index:
                    continue
                key = (min(gpu.index, peer), max(gpu.index, peer))
                seen = pair_counts.setdefault(key, {})
                seen[gpu.index] = seen.get(gpu.index, 0) + 1
            elif link.remote_device_type == "switch":
                switch_links[gpu.index] = switch_links.get(gpu.index, 0) + 1
                switches_of.setdefault(gpu.index, set()).add(link.remote_pci_bus_id)
    # Both ends report a link; the smaller count is what both agree on.
    pairs = {key: min(ends.values()) if len(ends) == 2 else max(ends.values()) for key, ends in pair_counts.items()}
    return NvlinkFabric(
        pairs=pairs,
        islands=_islands(switches_of),
        island_links=switch_links,
        source=report.source,
    )


def _islands(switches_of: dict[int, set[str]]) -> tuple[tuple[int, ...], ...]:
    groups: list[tuple[set[int], set[str]]] = []
    for gpu in sorted(switches_of):
        merged_gpus, merged_switches = {gpu}, set(switches_of[gpu])
        keep = []
        for gpus, switches in groups:
            if switches & merged_switches:
                merged_gpus |= gpus
                merged_switches |= switches
            else:
                keep.append((gpus, switches))
        groups = keep + [(merged_gpus, merged_switches)]
    return tuple(sorted(tuple(sorted(gpus)) for gpus, _ in groups))


def parse_minor_number(entry: dict, where: str) -> int | None:
    """nvml.json's optional `minor_number` (nvmlDeviceGetMinorNumber); ValueError if malformed."""
    value = entry.get("minor_number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 20:
        raise ValueError(f"{where}.minor_number: expected a non-negative integer")
    return value


def live_minor_number(pynvml: Any, handle: Any) -> int | None:
    """nvmlDeviceGetMinorNumber, None where the call or the binding is missing (guarded:
    old bindings, MIG and vGPU guests may lack it)."""
    getter = getattr(pynvml, "nvmlDeviceGetMinorNumber", None)
    if getter is None:
        return None
    try:
        value = getter(handle)
    except Exception:  # NVMLError_NotSupported and friends vary by binding version
        return None
    return value if isinstance(value, int) and value >= 0 else None


def nvml_minors(report: NvmlReport | None) -> dict[str, int]:
    """PCI address -> minor number, for the GPUs NVML gave one."""
    if report is None:
        return {}
    return {gpu.pci_bus_id: gpu.minor_number for gpu in report.gpus if gpu.minor_number is not None}
