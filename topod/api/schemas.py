"""The JSON Schemas of the API's bodies and answers (the lease, its placements and
decision, health, IRQs, telemetry, scopes, errors), for topod.api.openapi's document.

Its own module because a schema says what one body is, with its bounds taken from the
same constants and RequestLimits the validators use; the document (paths, operations,
the statuses each returns) only refers to them.
"""

from __future__ import annotations

from topod.alloc.nics import MAX_NICS_PER_GPU
from topod.alloc.request import (
    LEVELS, MAX_CPUS, MAX_CPUS_PER_GPU, MAX_GPUS, MAX_JOB_LENGTH, MAX_MEMORY_MIB, MAX_MODEL_LENGTH, MAX_NEAR_LENGTH,
    MAX_PRIORITY, MIN_PRIORITY,
)
from topod.alloc.service_request import RequestLimits

# No C0/C1 control characters, DEL or lone surrogates (the server's text_problem), and
# at least one non-blank character (the server strips and refuses an empty result).
TEXT_PATTERN = r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$"
CLEAN_TEXT = r"^[^\u0000-\u001f\u007f-\u009f]*$"
# must_include strings: a PCI address (domain optional) or a GPU/MIG UUID, any case.
# The server strips surrounding blanks before it reads one (blanks that are not control
# characters: those are refused in every string).
BLANKS = r"[^\S\u0000-\u001f\u007f-\u009f]*"
GPU_NAME_PATTERN = (rf"^{BLANKS}(?:(?:[0-9a-fA-F]{{4,8}}:)?[0-9a-fA-F]{{2}}:[0-9a-fA-F]{{2}}\.[0-7]"
                    rf"|(?:[gG][pP][uU]|[mM][iI][gG])-[0-9a-fA-F-]{{8,}}){BLANKS}$")
# near: node:N, a PCI address (domain optional, any case) or a kernel device name, blanks
# around stripped (topod.alloc.request._near); the name at most MAX_NEAR_LENGTH long.
NEAR_PATTERN = (rf"^{BLANKS}(?:node:[0-9]{{1,9}}|(?:[0-9a-fA-F]{{4,8}}:)?[0-9a-fA-F]{{2}}:[0-9a-fA-F]{{2}}\.[0-7]"
                rf"|[A-Za-z0-9][A-Za-z0-9_.@-]{{0,{MAX_NEAR_LENGTH - 1}}}){BLANKS}$")


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in word)


# A telemetry link id as topod.probe.backend.parse_link reads it: kind/src/dst, any case,
# blanks around each part; mem node->node, h2d node->device, d2h device->node, p2p
# device->device, a device being gpuN or a PCI address with its domain.
_NODE_END = _any_case("node") + "[0-9]+"
_DEVICE_END = f"(?:{_any_case('gpu')}[0-9]+|[0-9a-fA-F]{{4,8}}:[0-9a-fA-F]{{2}}:[0-9a-fA-F]{{2}}\\.[0-7])"
LINK_PATTERN = f"^{BLANKS}(?:" + "|".join(
    f"{_any_case(kind)}{BLANKS}/{BLANKS}{src}{BLANKS}/{BLANKS}{dst}" for kind, src, dst in (
        ("mem", _NODE_END, _NODE_END), ("h2d", _NODE_END, _DEVICE_END), ("d2h", _DEVICE_END, _NODE_END),
        ("p2p", _DEVICE_END, _DEVICE_END))) + f"){BLANKS}$"

ERROR = {
    "type": "object", "required": ["code", "message"], "additionalProperties": False,
    "description": "Every error. `code` is machine-readable: invalid_json, invalid_request, unknown_gpu, "
                   "unknown_device (a lease's `near` names no device or node of this host), "
                   "invalid_telemetry (400); permission_denied (403); lease_not_found, not_found (404); "
                   "method_not_allowed (405, with an Allow header); request_timeout (408: a body that "
                   "stalled for [api] idle_timeout_seconds); insufficient_gpus, insufficient_cpus, "
                   "insufficient_nics, level_unreachable, gpu_already_leased, wait_timeout, uid_quota, group_quota "
                   "(409); payload_too_large (413); "
                   "unsupported_media_type (415: a Content-Type charset other than UTF-8); queue_full (429); "
                   "internal_error and other server faults (500, with request_id); unavailable, "
                   "too_many_connections (503).",
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "request_id": {"type": "string", "description": "500 only: the id the daemon log carries"},
        "retryable": {"type": "boolean", "description": "allocation errors: false when waiting cannot help "
                                                        "(the host never has enough GPUs of that kind)"},
        "held": {"type": "integer", "minimum": 0,
                 "description": "uid_quota, group_quota: GPUs the uid (the group's members) hold now"},
        "asked": {"type": "integer", "minimum": 0, "description": "uid_quota, group_quota: GPUs this request asks for"},
        "cap": {"type": "integer", "minimum": 0,
                "description": "uid_quota, group_quota: [alloc] max_gpus_per_uid or the group's max_gpus_per_group; "
                               "retryable is true only when asked <= cap (the holder's own releases make room)"},
        "uid": {"type": "integer", "minimum": 0, "description": "uid_quota, group_quota: the caller's uid"},
        "group": {"type": "string", "description": "group_quota: the capped group"},
    },
}


def lease_request(limits: RequestLimits) -> dict:
    return {
        "type": "object",
        "required": ["gpus"],
        "additionalProperties": False,
        "description": "A GPU lease (gpus >= 1), or a lease without GPUs: gpus 0 with `cpus` (and `near`); "
                       "`cpus` and `near` are for the latter only, and it asks for nothing of GPUs (no model, "
                       "min_memory_mib, gpu_memory_nodes, nics_per_gpu or must_include).",
        # gpus 0: cpus required and nothing asked of GPUs; gpus >= 1: neither cpus nor near.
        "if": {"properties": {"gpus": {"const": 0}}},
        "then": {"required": ["cpus"],
                 "properties": {"must_include": {"maxItems": 0}, "model": {"type": "null"},
                                "min_memory_mib": {"const": 0}, "gpu_memory_nodes": {"const": False},
                                "nics_per_gpu": {"enum": [None, 0]}}},
        "else": {"not": {"anyOf": [{"required": ["cpus"]}, {"required": ["near"]}]}},
        "properties": {
            "gpus": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS,
                     "description": "number of GPUs; 0: a lease without GPUs (then `cpus` is required)"},
            "cpus": {"type": "integer", "minimum": 1, "maximum": MAX_CPUS,
                     "description": "gpus 0 only: logical CPUs, rounded up to whole physical cores (every "
                                    "hyper-thread of a core), from the same pool as the GPU leases' CPUs; never "
                                    "isolated, nohz_full or reserved ones. 409 insufficient_cpus when too few are "
                                    "free (retryable false when the node, or at level 'any' the host, never has "
                                    "that many)"},
            "near": {"type": ["string", "null"], "pattern": NEAR_PATTERN,
                     "description": "gpus 0 only: the CPUs come from this device's NUMA node, its PCIe local CPUs "
                                    "first: a device name (nvme1, mlx5_0, eth0), a PCI address or node:N (400 "
                                    "unknown_device when this host has none such, naming what it has). Levels "
                                    "good and best keep every CPU on that node; 'any' takes the rest from the "
                                    "nearest nodes by NUMA distance. Null or left out: the node with the most "
                                    "free CPUs"},
            "must_include": {
                "type": "array", "uniqueItems": True, "maxItems": MAX_GPUS,
                "description": "GPU indices, PCI addresses or UUIDs the set must contain (at most `gpus` of them)",
                "items": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": MAX_GPUS},
                                    {"type": "string", "pattern": GPU_NAME_PATTERN}]},
            },
            "level": {"type": "string", "enum": list(LEVELS), "description": "default: [alloc] default_level"},
            "priority": {"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY},
            "cpus_per_gpu": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": MAX_CPUS_PER_GPU},
                                       {"const": "auto"}],
                             "description": "logical CPUs per GPU (whole cores); \"auto\": each GPU's fair share "
                                            "of its node; default from [alloc] cpus_per_gpu (auto)"},
            "min_memory_mib": {"type": "integer", "minimum": 0, "maximum": MAX_MEMORY_MIB},
            "model": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_MODEL_LENGTH,
                      "pattern": TEXT_PATTERN,
                      "description": "case-insensitive substring of the GPU model name (null: any model)"},
            "preemptible": {"type": "boolean"},
            "gpu_memory_nodes": {"type": "boolean",
                                 "description": "also bind memory to each GPU's own memory NUMA node (Grace)"},
            "nics_per_gpu": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_NICS_PER_GPU,
                             "description": "RDMA NIC ports each GPU must get, nearest first (409 insufficient_nics "
                                            "otherwise; 400 when [alloc] nics = \"none\"); null or left out: "
                                            "the nearest one where there is one; 0: none"},
            "ttl_seconds": {"type": ["number", "null"], "exclusiveMinimum": 0,
                            "maximum": limits.max_ttl_seconds,
                            "description": "the lease ends this long after the grant (max: [alloc] "
                                           "renew_max_ttl_seconds)"},
            "owner_pid": {"type": ["integer", "null"], "minimum": 1, "maximum": limits.pid_max,
                          "description": "the lease ends when this process exits (max: the kernel's pid_max)"},
            "wait": {"type": ["number", "null"], "minimum": 0, "maximum": limits.max_wait_seconds,
                     "description": "seconds to queue; 0 fails fast (max: [alloc] max_wait_seconds)"},
            "job": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_JOB_LENGTH, "pattern": TEXT_PATTERN,
                    "description": "a label for the lease (null: none, as when it is left out)"},
        },
    }


def renew_request(limits: RequestLimits) -> dict:
    return {
        "type": "object", "additionalProperties": False,
        "description": "`{}` or no body renews with the lease's own ttl (400 if it has none)",
        "properties": {"ttl_seconds": {"type": ["number", "null"], "exclusiveMinimum": 0,
                                       "maximum": limits.max_ttl_seconds}},
    }


TELEMETRY = {
    "type": "object", "required": ["link", "bytes", "seconds"], "additionalProperties": False,
    "properties": {
        "link": {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": LINK_PATTERN,
                 "description": "a link id of this host (GET /v1/links): kind/src/dst, e.g. p2p/gpu0/gpu1 or "
                                "h2d/node0/0000:18:00.0 (400 invalid_telemetry for a link this host has not, "
                                "a GPU it has not, a p2p link from a device to itself, or an implausible rate)"},
        "bytes": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
        "seconds": {"type": "number", "exclusiveMinimum": 0},
    },
}

INTS = {"type": "array", "items": {"type": "integer"}}
NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_NUMBER = {"type": ["number", "null"]}

PLACEMENT = {
    "type": "object",
    "required": ["index", "address", "uuid", "numa_node", "cpus", "cpu_node", "memory_node"],
    "properties": {
        "index": {"type": "integer"},
        "address": {"type": "string"},
        "uuid": {"type": ["string", "null"]},
        "numa_node": NULLABLE_INT,
        "cpus": INTS,
        "cpu_node": NULLABLE_INT,
        "memory_node": NULLABLE_INT,
        "nics": {"type": "array", "description": "RDMA NIC ports this GPU sends through, nearest first ([alloc] nics; "
                                                 "absent in leases stored before them)",
                 "items": {"type": "object", "required": ["name", "address", "port", "level"],
                           "additionalProperties": False,
                           "properties": {"name": {"type": "string", "description": "RDMA device, e.g. mlx5_0"},
                                          "address": {"type": "string", "description": "its PCI function"},
                                          "port": {"type": "integer", "minimum": 1},
                                          "level": {"type": "string",
                                                    "enum": ["PIX", "PXB", "PHB", "NODE", "SYS"],
                                                    "description": "distance from the GPU"}}}},
    },
}

DECISION = {
    "type": "object",
    "required": ["cost", "best_cost", "level", "requested_level", "satisfaction", "numa_nodes", "performance",
                 "exact", "cpu_fallback", "reasons"],
    "properties": {
        "cost": {"type": "number"},
        "best_cost": {"type": "number"},
        "level": {"type": "string"},
        "requested_level": {"type": "string"},
        "satisfaction": {"type": "number"},
        "numa_nodes": INTS,
        "performance": {"type": "object"},
        "exact": {"type": "boolean"},
        "cpu_fallback": {"type": "boolean"},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "near": {"type": "string", "description": "a lease without GPUs: the device or node its CPUs were chosen "
                                                  "near, as the request named it (absent otherwise)"},
    },
}

LEASE = {
    "type": "object",
    "required": ["id", "state", "owner_uid", "owner_gid", "owner_pid", "requester_pid", "job", "priority",
                 "preemptible", "gpus", "cpus", "memory_nodes", "missing_gpus", "placements", "created", "expires",
                 "ttl_seconds", "preempt_deadline", "confirmed", "decision", "environment"],
    "properties": {
        "id": {"type": "string"},
        "state": {"type": "string", "enum": ["active", "preempting", "degraded"]},
        "owner_uid": {"type": "integer"},
        "owner_gid": {"type": "integer"},
        "owner_pid": NULLABLE_INT,
        "requester_pid": NULLABLE_INT,
        "job": {"type": ["string", "null"]},
        "priority": {"type": "integer"},
        "preemptible": {"type": "boolean"},
        "gpus": INTS,
        "cpus": INTS,
        "memory_nodes": INTS,
        "missing_gpus": INTS,
        "placements": {"type": "array", "items": {"$ref": "#/components/schemas/Placement"}},
        "created": {"type": "number"},
        "expires": NULLABLE_NUMBER,
        "ttl_seconds": NULLABLE_NUMBER,
        "preempt_deadline": NULLABLE_NUMBER,
        "confirmed": {"type": "boolean", "description": (
            "false while the answer granting a lease with neither ttl_seconds nor owner_pid is not known to "
            "have been written; after a crash in that window it ends at `expires` unless its holder renews it")},
        "decision": {"$ref": "#/components/schemas/Decision"},
        "environment": {"type": "object", "additionalProperties": {"type": "string"}},
        "enforcement": {"type": "string", "enum": ["cgroup", "affinity", "none"], "description": (
            "what holds the lease's CPUs: affinity (topoctl run and topoctl bind pin the job; it may undo it) "
            "or none (no CPUs, or a root that is not this host); /v1/health's enforcement says why; cgroup once "
            "a process was placed in its scope on a host whose cgroup v2 cpusets hold it")},
        "scope": {"type": ["string", "null"], "description": (
            "the systemd scope its job was placed in by POST /v1/leases/{id}/scope (topod-lease-<id>.scope); "
            "the lease ends when that scope ends")},
    },
}


def scope_request(limits: RequestLimits) -> dict:
    return {"type": "object", "required": ["pid"], "additionalProperties": False, "properties": {
        "pid": {"type": "integer", "minimum": 1, "maximum": limits.pid_max, "description": (
            "a running process of the caller, or one of its descendants (root: any but PID 1 and topod); "
            "400 invalid_request 'no process' when there is none")}}}


SCOPE_ANSWER = {
    "type": "object", "required": ["lease", "pid", "scope", "created", "enforcement", "reason"],
    "properties": {
        "lease": {"type": "string"},
        "pid": {"type": "integer"},
        "scope": {"type": "string", "description": "topod-lease-<id>.scope"},
        "created": {"type": "boolean", "description": "true: a new scope; false: joined the lease's scope"},
        "enforcement": {"type": "string", "enum": ["cgroup", "none"], "description": (
            "what holds this process's CPUs now: cgroup (the host's cgroup v2 cpuset enforces the scope's "
            "AllowedCPUs=) or none (recorded only: pin the process, e.g. topoctl bind)")},
        "reason": {"type": "string"},
        "host_enforcement": {"type": "string", "enum": ["cgroup", "affinity", "none"]},
        "lease_enforcement": {"type": "string", "enum": ["cgroup", "affinity", "none"]},
    },
}

CPULIST = {"type": "string", "description": "a CPU list such as \"0-3,8\" (\"\" for none)"}
IRQ_SETTINGS = {
    "type": "object",
    "description": ("the [irq] section the daemon's balancer uses, defaults filled in (mode dry-run while "
                    "writes are withheld in a container); `topoctl irq plan` plans with it"),
    "required": ["mode", "banned_cpus", "housekeeping_cpus", "irqbalance", "policy"],
    "properties": {
        "mode": {"type": "string", "enum": ["continuous", "dry-run", "off"]},
        "banned_cpus": CPULIST,
        "housekeeping_cpus": CPULIST,
        "irqbalance": {"type": "string", "enum": ["yield", "ban"]},
        "policy": {"type": "object", "additionalProperties": {"type": "string"}},
        "irq_overrides": {"type": "object", "additionalProperties": {"type": "string"}},
        "device_overrides": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
IRQS = {
    "type": "object",
    "required": ["settings"],
    "description": "the current plan and last cycle (absent while IRQ balancing is off or starting)",
    "properties": {"settings": IRQ_SETTINGS},
}

HEALTH = {
    "type": "object",
    "required": ["status"],
    "properties": {
        "status": {"type": "string", "enum": ["ok", "degraded"]},
        "loops": {"type": "object"},
        "gpus": {"type": "integer", "minimum": 0},
        "gpus_free": {"type": "integer"},
        "leases": {"type": "integer", "minimum": 0},
        "waiting": {"type": "integer", "minimum": 0},
    },
}

ENDED = {"type": "object", "properties": {"gpus": INTS}}

RELOAD_VERDICT = {"type": "object", "required": ["applied", "path", "reason", "restart_required"], "properties": {
    "applied": {"type": "boolean"},
    "path": {"type": ["string", "null"]},
    "reason": {"type": ["string", "null"], "description": "why the file was refused (one line naming the key)"},
    "restart_required": {"type": "array", "items": {"type": "string"},
                         "description": "keys read only at start whose change waits for a restart"}}}
