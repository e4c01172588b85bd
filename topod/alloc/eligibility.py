"""Which GPUs a request may take: the model and memory filter (eligible_gpus) and the
must_include GPUs resolved on the host and checked against that filter (forced_gpus).

Its own module because it reads the request alone, before anything about what is free
or what the set costs: a request it refuses is refused on any free state, and the
engine's search never sees a GPU it filtered out.
"""

from __future__ import annotations

from topod.alloc.errors import InvalidRequestError, UnknownGpuError
from topod.alloc.hostview import HostView
from topod.alloc.request import Request


def eligible_gpus(view: HostView, request: Request, reasons: list[str]) -> list[int]:
    if not request.model and not request.min_memory_mib:
        return view.everyone  # no filter: every position (read only)
    out, skipped = [], []
    model = request.model.lower() if request.model else None
    for p, gpu in enumerate(view.gpus):
        if model is not None and model not in (gpu.name or "").lower():
            skipped.append(f"{gpu.index} (model {gpu.name!r})")
        elif request.min_memory_mib and (gpu.memory_total_mib is None or gpu.memory_total_mib < request.min_memory_mib):
            skipped.append(f"{gpu.index} (memory {gpu.memory_total_mib} MiB)")
        else:
            out.append(p)
    if skipped:
        reasons.append("filtered out GPU " + ", ".join(skipped))
    return out


def forced_gpus(view: HostView, request: Request, eligible: list[int]) -> set[int]:
    must: set[int] = set()
    allowed = set(eligible)
    for item in request.must_include:
        p = view.resolve(item)
        if p is None:
            known = ", ".join(str(g.index) for g in view.gpus)
            raise UnknownGpuError(f"must_include: no GPU {item!r} on this host (GPUs: {known})")
        if p not in allowed:
            raise InvalidRequestError("must_include", f"GPU {view.gpus[p].index} does not match the model/memory "
                                                      "filter of this request")
        must.add(p)
    return must
