"""Which GPUs a process's environment makes visible, by the runtimes' own rules.

CUDA: CUDA_VISIBLE_DEVICES lists indices or GPU-UUIDs (possibly abbreviated), and stops at
the first entry it cannot parse (topod.doctor.report.gpus_from_env).

ROCm: ROCR_VISIBLE_DEVICES is applied first, to ROCr's own numbering of the AMD GPUs (KFD
node order; indices or GPU-<unique_id hex>); HIP then indexes what is left, renumbered
from 0, with HIP_VISIBLE_DEVICES, or CUDA_VISIBLE_DEVICES when that is unset. So
ROCR_VISIBLE_DEVICES=4,5 with CUDA_VISIBLE_DEVICES=4,5 selects nothing at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from topod.model import Topology

AMD_NAMES = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _select(entries: str, pool: list[int], uuid_of: Mapping[int, str | None]) -> list[int]:
    """The pool members an environment list names, in its order; stops at the first entry
    that names none (as the runtimes do)."""
    chosen: list[int] = []
    for entry in (e.strip() for e in entries.split(",")):
        if entry.isdigit() and int(entry) < len(pool):
            chosen.append(pool[int(entry)])
        elif entry.upper().startswith("GPU-"):
            match = [g for g in pool if (uuid_of.get(g) or "").lower().startswith(entry.lower())]
            if len(match) != 1:
                break
            chosen.append(match[0])
        else:
            break
    return list(dict.fromkeys(chosen))


def rocm_visible(env: Mapping[str, str], topology: Topology) -> tuple[int, ...] | None:
    """GPU indices a HIP process sees; None when the environment sets none of ROCm's
    variables (nor CUDA_VISIBLE_DEVICES) or the host has no AMD GPU."""
    amd = [gpu.index for gpu in topology.gpus if gpu.amd is not None or gpu.vendor == "amd"]
    if not amd:
        return None
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    hip = env.get("HIP_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))
    if rocr is None and hip is None:
        return None
    uuid_of = {gpu.index: gpu.uuid for gpu in topology.gpus}
    pool = _select(rocr, amd, uuid_of) if rocr is not None else amd
    if hip is not None:
        pool = _select(hip, pool, uuid_of)
    return tuple(sorted(pool))
