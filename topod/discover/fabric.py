"""What NVML says beyond PCIe and NVLink pairs: a GPU's memory NUMA node, its NVLink-C2C
link to the CPU, and its multi-node NVLink fabric membership (NVL72-class clique).

Read live through pynvml (each call guarded: older bindings and drivers lack them) or from
the `nvml.json` fields `memory_numa_node`, `c2c` and `fabric`. `nvlink_domain` sums the
GPUs' fabric facts into the host-level view exports publish.
"""

from __future__ import annotations

from topod.model import C2cLink, Gpu, GpuFabric
from topod.record import record

TYPE_CHECKING = False  # typing costs ~3 ms of every topoctl start; annotations are never evaluated
if TYPE_CHECKING:
    from typing import Any

FABRIC_STATES = ("not-supported", "not-started", "in-progress", "completed", "unknown")
# NVML_GPU_FABRIC_STATE_* values.
_STATE_NAMES = {0: "not-supported", 1: "not-started", 2: "in-progress", 3: "completed"}
# One-direction NVLink-C2C bandwidth by GPU model, GB/s, when NVML gives no figure:
# NVIDIA's datasheets give 900 GB/s bidirectional for GH200 and GB200/GB300 superchips.
C2C_TABLE_GBPS = {"GH200": 450.0, "GB200": 450.0, "GB300": 450.0}


@record
class GpuExtras:
    memory_numa_node: int | None = None
    c2c: C2cLink | None = None
    fabric: GpuFabric | None = None


def c2c_table_bandwidth(name: str | None) -> float | None:
    """The documented one-direction C2C GB/s for a GPU model name, None when unlisted."""
    text = (name or "").upper()
    for model, gbps in C2C_TABLE_GBPS.items():
        if model in text:
            return gbps
    return None


def parse_extras(entry: dict[str, Any], where: str, name: str | None) -> GpuExtras:
    """The nvml.json fields; raises ValueError naming the first bad one."""
    node = entry.get("memory_numa_node")
    if node is not None and (not isinstance(node, int) or isinstance(node, bool) or node < 0):
        raise ValueError(f"{where}.memory_numa_node: expected a non-negative integer or null")
    return GpuExtras(memory_numa_node=node, c2c=_parse_c2c(entry.get("c2c"), f"{where}.c2c", name),
                     fabric=_parse_fabric(entry.get("fabric"), f"{where}.fabric"))


def _parse_c2c(value: Any, where: str, name: str | None) -> C2cLink | None:
    if value is None or value is False:
        return None
    if value is True:
        return C2cLink(c2c_table_bandwidth(name), "table")
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object, true or null")
    if value.get("enabled") is False:
        return None
    gbps = value.get("bandwidth_gbps")
    if gbps is not None and (isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or gbps <= 0):
        raise ValueError(f"{where}.bandwidth_gbps: expected a positive number")
    if gbps is None:
        return C2cLink(c2c_table_bandwidth(name), "table")
    return C2cLink(float(gbps), "nvml-file")


def _parse_fabric(value: Any, where: str) -> GpuFabric | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object or null")
    uuid = value.get("cluster_uuid")
    if uuid is not None and not isinstance(uuid, str):
        raise ValueError(f"{where}.cluster_uuid: expected a string")
    clique = value.get("clique_id")
    if clique is not None and (isinstance(clique, bool) or not isinstance(clique, int) or clique < 0):
        raise ValueError(f"{where}.clique_id: expected a non-negative integer")
    state = value.get("state", "unknown")
    if state not in FABRIC_STATES:
        raise ValueError(f"{where}.state: expected one of {', '.join(FABRIC_STATES)}")
    health = value.get("health")
    if health is not None and not isinstance(health, str):
        raise ValueError(f"{where}.health: expected a string")
    return GpuFabric(cluster_uuid=_clean_uuid(uuid), clique_id=clique, state=state, health=health)


def _clean_uuid(uuid: str | None) -> str | None:
    """An all-zero cluster UUID means 'none' (NVML fills it so on unsupported GPUs)."""
    if uuid is None or not uuid.replace("-", "").strip("0"):
        return None
    return uuid.lower()


def extras_to_json(extras: GpuExtras) -> dict[str, object]:
    """The nvml.json form (what `topoctl snapshot` writes for a live host)."""
    return {
        "memory_numa_node": extras.memory_numa_node,
        "c2c": {"bandwidth_gbps": extras.c2c.bandwidth_gbps} if extras.c2c else None,
        "fabric": extras.fabric.to_json() if extras.fabric else None,
    }


# ---- live NVML --------------------------------------------------------------------------

def live_extras(pynvml: Any, handle: Any, name: str | None) -> GpuExtras:
    """Each query guarded: a binding without the call, or a driver answering
    NOT_SUPPORTED, leaves that fact unknown."""
    return GpuExtras(memory_numa_node=_live_numa(pynvml, handle), c2c=_live_c2c(pynvml, handle, name),
                     fabric=_live_fabric(pynvml, handle))


def _call(pynvml: Any, function: str, *args: Any) -> Any:
    call = getattr(pynvml, function, None)
    if call is None:
        return None
    try:
        return call(*args)
    except (pynvml.NVMLError, AttributeError, TypeError, ValueError):
        return None


def _live_numa(pynvml: Any, handle: Any) -> int | None:
    node = _call(pynvml, "nvmlDeviceGetNumaNodeId", handle)
    return node if isinstance(node, int) and node >= 0 else None


def _live_c2c(pynvml: Any, handle: Any, name: str | None) -> C2cLink | None:
    info = _call(pynvml, "nvmlDeviceGetC2cModeInfoV", handle)
    if info is None or not getattr(info, "isC2cEnabled", 0):
        return None
    gbps = _live_c2c_bandwidth(pynvml, handle)
    return C2cLink(gbps, "nvml-live") if gbps else C2cLink(c2c_table_bandwidth(name), "table")


def _live_c2c_bandwidth(pynvml: Any, handle: Any) -> float | None:
    """links x per-link max bandwidth (MB/s) from the C2C field values, when the binding
    knows them."""
    count_id = getattr(pynvml, "NVML_FI_DEV_C2C_LINK_COUNT", None)
    bw_id = getattr(pynvml, "NVML_FI_DEV_C2C_LINK_GET_MAX_BW", None)
    if count_id is None or bw_id is None:
        return None
    values = _call(pynvml, "nvmlDeviceGetFieldValues", handle, [count_id, bw_id])
    try:
        count, per_link = (int(v.value.uiVal) for v in values)  # type: ignore[union-attr]
    except (TypeError, ValueError, AttributeError):
        return None
    return count * per_link / 1000.0 if count and per_link else None


def _live_fabric(pynvml: Any, handle: Any) -> GpuFabric | None:
    import ctypes

    info = None
    for call, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                         ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
        if not (hasattr(pynvml, call) and hasattr(pynvml, struct)):
            continue
        try:
            candidate = getattr(pynvml, struct)()
            getattr(pynvml, call)(handle, ctypes.byref(candidate))
        except (pynvml.NVMLError, AttributeError, TypeError, ctypes.ArgumentError):
            continue
        info = candidate
        break
    if info is None:
        return None
    state = _STATE_NAMES.get(int(getattr(info, "state", -1)), "unknown")
    if state == "not-supported":
        return None
    uuid = _format_uuid(bytes(info.clusterUuid)) if hasattr(info, "clusterUuid") else None
    return GpuFabric(cluster_uuid=_clean_uuid(uuid), clique_id=int(getattr(info, "cliqueId", 0)),
                     state=state, health=fabric_health(getattr(info, "status", 0), getattr(info, "healthMask", None)))


def fabric_health(status: int, mask: int | None) -> str:
    """'ok', 'degraded-bandwidth' (NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE) or
    'error-N' for a non-success registration status."""
    if status:
        return f"error-{int(status)}"
    if mask is not None and (int(mask) & 0x3) == 1:
        return "degraded-bandwidth"
    return "ok"


def _format_uuid(raw: bytes) -> str:
    hexed = raw[:16].hex().ljust(32, "0")
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:32]}"


# ---- the host's NVLink domain -----------------------------------------------------------

def nvlink_domain(gpus: tuple[Gpu, ...] | list[Gpu]) -> dict[str, object] | None:
    """{cluster_uuid, clique_ids, gpus_per_clique, state} from the GPUs' fabric facts, None
    when no GPU is in a multi-node NVLink cluster. With several cluster UUIDs (a
    mis-cabled tray), the one most GPUs name wins and `other_cluster_uuids` lists the rest."""
    members = [gpu for gpu in gpus if gpu.fabric is not None and gpu.fabric.cluster_uuid]
    if not members:
        return None
    counts: dict[str, int] = {}
    for gpu in members:
        counts[gpu.fabric.cluster_uuid] = counts.get(gpu.fabric.cluster_uuid, 0) + 1  # type: ignore[union-attr,index]
    cluster = min(counts, key=lambda uuid: (-counts[uuid], uuid))
    cliques: dict[int, list[int]] = {}
    states = set()
    for gpu in members:
        fabric = gpu.fabric
        assert fabric is not None
        if fabric.cluster_uuid != cluster:
            continue
        states.add(fabric.state)
        if fabric.clique_id is not None:
            cliques.setdefault(fabric.clique_id, []).append(gpu.index)
    return {
        "cluster_uuid": cluster,
        "clique_ids": sorted(cliques),
        "gpus_per_clique": {str(c): sorted(g) for c, g in sorted(cliques.items())},
        "state": "completed" if states == {"completed"} else ",".join(sorted(states)),
        "other_cluster_uuids": sorted(uuid for uuid in counts if uuid != cluster),
    }


def nvlink_domain_attributes(topology: Any) -> list[tuple[str, str]]:
    """(name, value) pairs for exports: nvlink-cluster and nvlink-clique (comma-separated
    when the host's GPUs sit in several cliques)."""
    domain = nvlink_domain(topology.gpus)
    if domain is None:
        return []
    return [("nvlink-cluster", str(domain["cluster_uuid"])),
            ("nvlink-clique", ",".join(str(c) for c in domain["clique_ids"]))]  # type: ignore[union-attr]
