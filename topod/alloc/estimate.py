"""Performance estimate of a GPU set: relative ring all-reduce bandwidth.

How it is computed:

1. Each GPU pair gets a nominal one-direction bandwidth from its distance level:
   NV# / NVS#: # links x 25 GB/s (NVLink 3/4 per-link rate);
   XGMI: # links x 64 GB/s (an MI300X xGMI link);
   PIX and PXB: the PCIe rate of the slower GPU link (GT/s x width x 128/130 / 8);
   PHB: 0.9 x that; NODE: 0.8 x that (two root complexes inside one socket);
   SYS: 0.33 x that x 20/SLIT (the seed: cross-socket copies get < 1/3 of the bandwidth).
   A probe correction that scales the pair's weight by f divides its bandwidth by f.
   A GPU whose PCIe link is unknown counts as Gen4 x16 (31.5 GB/s), and the decision
   says so.
2. A ring all-reduce moves every byte over every hop, so it runs at the pace of its
   slowest hop; topod takes the weakest pair of the set as that hop (conservative: NCCL
   may route a ring around one weak pair).
3. relative_bandwidth = weakest pair of the set / weakest pair of the host's best set of
   that size (1.0 = as fast as this host can do; one GPU = 1.0).
4. level_floors: what each level guarantees at least, relative the same way:
   best 1.0; good: the weakest pair inside one NUMA node when good keeps the size in one
   node, else the weakest pair on the host; any: the weakest pair on the host.
"""

from __future__ import annotations

from topod.distance import (BASE_WEIGHTS, SLIT_REMOTE, XGMI_GBPS_PER_LINK, Distance, nvlink_weight, sys_weight,
                            xgmi_weight)
from topod.model import PciDevice, gts

NVLINK_GBPS_PER_LINK = 25.0
FALLBACK_PCIE_GBPS = 16.0 * 16 * 128 / 130 / 8  # Gen4 x16
LEVEL_FACTOR = {"PIX": 1.0, "PXB": 1.0, "PHB": 0.9, "NODE": 0.8}
SYS_FACTOR = 0.33


def pcie_gbps(device: PciDevice | None) -> float | None:
    """One-direction payload rate of a device's trained link, None when unknown."""
    if device is None or device.link is None:
        return None
    speed, width = gts(device.link.current_speed), device.link.current_width
    if not speed or not width:
        return None
    encoding = 128 / 130 if speed >= 8.0 else 0.8  # Gen3+ 128b/130b, Gen1/2 8b/10b
    return speed * width * encoding / 8


def pair_bandwidth(distance: Distance, link_a: float | None, link_b: float | None) -> float:
    """Nominal GB/s of one GPU pair (see the module docstring)."""
    if distance.level in ("NV", "NVS"):
        nominal = distance.links * NVLINK_GBPS_PER_LINK
        base_weight = nvlink_weight(distance.links)
    elif distance.level == "XGMI":
        nominal = distance.links * XGMI_GBPS_PER_LINK
        base_weight = xgmi_weight(distance.links)
    else:
        known = [rate for rate in (link_a, link_b) if rate is not None]
        pcie = min(known) if known else FALLBACK_PCIE_GBPS
        if distance.level == "SYS":
            slit = distance.slit if distance.slit is not None else SLIT_REMOTE
            nominal = pcie * SYS_FACTOR * SLIT_REMOTE / max(SLIT_REMOTE, slit)
            base_weight = sys_weight(distance.slit)
        else:
            nominal = pcie * LEVEL_FACTOR.get(distance.level, 1.0)
            base_weight = BASE_WEIGHTS.get(distance.level, 0.0)
    if base_weight > 0 and distance.weight > 0:
        nominal *= base_weight / distance.weight  # a measured correction scales the weight
    return nominal


def weakest(members: list[int], bandwidth: list[list[float]]) -> tuple[int, int] | None:
    """Positions of the set's weakest pair, None for fewer than two GPUs."""
    found: tuple[int, int] | None = None
    low = float("inf")
    for i, a in enumerate(members):
        row = bandwidth[a]
        for b in members[i + 1:]:
            if row[b] < low:
                low, found = row[b], (a, b)
    return found
