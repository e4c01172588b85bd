"""A lease: what a caller holds (GPUs with their CPUs and memory nodes, the engine's
typed decision, the environment a job runs with) and its JSON, which is both what the
API shows and what the lease store keeps (schema 2; schema 1 of topod 0.1 is read too)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from topod.alloc.nics import NicChoice
from topod.alloc.request import Decision, Performance, Placement

# Lease and waiter ids: unique, not secrets (who may end a lease is decided by the caller's
# credentials). Seeded once from the kernel: a getrandom() per lease released the GIL
# mid-request and cost up to 50 µs under load.
_IDS = random.Random(os.urandom(32))


def new_id(hex_digits: int = 16) -> str:
    return f"{_IDS.getrandbits(hex_digits * 4):0{hex_digits}x}"


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    state: str  # active | preempting | degraded (a GPU of it is gone)
    owner_uid: int
    owner_gid: int
    requester_pid: int | None
    owner_pid: int | None  # the lease ends when this process exits
    owner_start_time: float | None  # tells a recycled pid from the owner after a restart
    job: str | None
    priority: int
    preemptible: bool
    decision: Decision
    gpu_uuids: tuple[str | None, ...]  # per placement, for CUDA_VISIBLE_DEVICES and clients
    environment: dict[str, str]
    created: float  # wall-clock seconds
    expires: float | None  # wall-clock seconds; None = no ttl
    ttl_seconds: float | None
    preempt_deadline: float | None = None
    missing_gpus: tuple[int, ...] = ()  # GPUs of the lease the current topology lacks
    # False while the answer that granted a lease with neither ttl nor owner is not known
    # to have been sent: a crash in that window leaves it ending after a grace period.
    confirmed: bool = True
    # What holds the lease's CPUs (topod.enforce): affinity (topoctl run/bind pin the job) | none.
    enforcement: str = "none"
    # The systemd scope its job runs in when one was made through the API (topod-lease-<id>.scope).
    scope: str | None = None
    # every GPU's CPUs, or a lease without GPUs' own (Decision.cpu_only), sorted (derived)
    cpus: tuple[int, ...] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpus", tuple(sorted([*(c for cpus in self.decision.cpus.values() for c in cpus),
                                                       *self.decision.cpu_only])))

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.decision.gpus

    @property
    def memory_nodes(self) -> tuple[int, ...]:
        return self.decision.memory_nodes

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(placement.address for placement in self.decision.placements)

    def to_json(self) -> dict[str, Any]:
        """The lease as the API shows it and the store keeps it (schema 2)."""
        return {**self._head(), "placements": _placements_json(self.decision, self.gpu_uuids), **self._tail(),
                "decision": _decision_json(self.decision), "environment": dict(self.environment)}

    def json_text(self) -> str:
        """json.dumps(self.to_json(), allow_nan=False), to the byte, built from its
        decision's encoded parts: a decision the engine's memo gives again and again is
        encoded once, not per lease (the grant path's largest encoding). ValueError when
        a number is not finite, as json.dumps."""
        placements, decision = _decision_parts(self.decision, self.gpu_uuids)
        head, tail = _STRICT.encode(self._head()), _STRICT.encode(self._tail())
        return (f'{head[:-1]}, "placements": {placements}, {tail[1:-1]}, "decision": {decision}, '
                f'"environment": {_STRICT.encode(self.environment)}}}')

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state,
            "owner_uid": self.owner_uid, "owner_gid": self.owner_gid,
            "owner_pid": self.owner_pid, "requester_pid": self.requester_pid,
            "owner_start_time": self.owner_start_time,
            "job": self.job, "priority": self.priority, "preemptible": self.preemptible,
            "gpus": list(self.gpus), "cpus": list(self.cpus), "memory_nodes": list(self.memory_nodes),
            "missing_gpus": list(self.missing_gpus),
        }

    def _tail(self) -> dict[str, Any]:
        return {"created": self.created, "expires": self.expires, "ttl_seconds": self.ttl_seconds,
                "preempt_deadline": self.preempt_deadline, "confirmed": self.confirmed,
                "enforcement": self.enforcement, "scope": self.scope}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Lease:
        """Schema 2 (to_json) or schema 1 (the untyped decision of topod 0.1)."""
        if "placements" not in body:
            body = _upgrade_v1(body)
        placements = tuple(Placement(index=int(p["index"]), address=str(p["address"]), numa_node=p["numa_node"],
                                     cpus=tuple(p["cpus"]), cpu_node=p.get("cpu_node"),
                                     nics=tuple(NicChoice.from_json(n) for n in p.get("nics") or ()))
                           for p in body["placements"])
        raw = body["decision"]
        perf = raw.get("performance") or {}
        decision = Decision(
            gpus=tuple(p.index for p in placements), placements=placements,
            cpus={p.index: p.cpus for p in placements},
            memory_nodes=tuple(body["memory_nodes"]), numa_nodes=tuple(raw.get("numa_nodes", ())),
            cost=float(raw.get("cost", 0.0)), best_cost=float(raw.get("best_cost", 0.0)),
            level=str(raw.get("level", "any")), requested_level=str(raw.get("requested_level", "any")),
            satisfaction=float(raw.get("satisfaction", 1.0)),
            performance=Performance(relative_bandwidth=float(perf.get("relative_allreduce_bandwidth", 1.0)),
                                    weakest_pair=perf.get("weakest_pair"),
                                    weakest_pair_gbps=perf.get("weakest_pair_gbps"),
                                    level_floors=dict(perf.get("level_floors", {}))),
            exact=bool(raw.get("exact", True)), cpu_fallback=bool(raw.get("cpu_fallback", False)),
            reasons=tuple(raw.get("reasons", ())),
            # A lease without GPUs: its CPUs are the lease's own (no placement holds them).
            cpu_only=() if placements else tuple(int(c) for c in body.get("cpus", ())),
            near=raw.get("near"),
        )
        return cls(
            id=body["id"], state=body["state"], owner_uid=body["owner_uid"], owner_gid=body["owner_gid"],
            requester_pid=body.get("requester_pid"), owner_pid=body.get("owner_pid"),
            owner_start_time=body.get("owner_start_time"), job=body.get("job"), priority=int(body["priority"]),
            preemptible=bool(body["preemptible"]), decision=decision,
            gpu_uuids=tuple(p.get("uuid") for p in body["placements"]),
            environment={str(k): str(v) for k, v in body.get("environment", {}).items()},
            created=float(body["created"]), expires=body.get("expires"), ttl_seconds=body.get("ttl_seconds"),
            preempt_deadline=body.get("preempt_deadline"), missing_gpus=tuple(body.get("missing_gpus", ())),
            confirmed=bool(body.get("confirmed", True)),
            enforcement=str(body.get("enforcement", "none")), scope=body.get("scope"),
        )


def _upgrade_v1(body: dict[str, Any]) -> dict[str, Any]:
    decision = dict(body.get("decision") or {})
    upgraded = dict(body)
    upgraded["placements"] = [{**p, "uuid": None} for p in decision.pop("gpus", [])]
    upgraded["owner_start_time"] = decision.pop("owner_start_time", None)
    upgraded["environment"] = decision.pop("environment", {})
    upgraded["decision"] = decision
    return upgraded


def _placements_json(decision: Decision, uuids: tuple[str | None, ...]) -> list[dict[str, Any]]:
    return [{**placement.to_json(), "uuid": uuid} for placement, uuid in zip(decision.placements, uuids)]


def _decision_json(decision: Decision) -> dict[str, Any]:
    return {
        "cost": round(decision.cost, 6), "best_cost": round(decision.best_cost, 6),
        "level": decision.level, "requested_level": decision.requested_level,
        "satisfaction": round(decision.satisfaction, 6), "numa_nodes": list(decision.numa_nodes),
        "performance": decision.performance.to_json(), "exact": decision.exact,
        "cpu_fallback": decision.cpu_fallback, "reasons": list(decision.reasons),
    } | ({} if decision.near is None else {"near": decision.near})


class DecisionMemo:
    """Values derived from a decision, kept per decision object (the engine's memo gives
    the same decision again and again): `key` names what else the value depends on, and
    the entry holds the decision, so its id names no other object while it is here. The
    oldest goes when `kept` are held."""

    def __init__(self, kept: int = 256) -> None:
        self.kept = kept
        self._entries: dict[int, tuple[Decision, Any, Any]] = {}

    def get(self, decision: Decision, key: Any, build: Callable[[], Any]) -> Any:
        entry = self._entries.get(id(decision))
        if entry is not None and entry[0] is decision and entry[1] == key:
            return entry[2]
        value = build()  # raises before anything is kept
        if len(self._entries) >= self.kept:
            try:
                self._entries.pop(next(iter(self._entries)), None)
            except (StopIteration, RuntimeError):  # emptied or changed meanwhile: nothing to make room for
                pass
        self._entries[id(decision)] = (decision, key, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)


_STRICT = json.JSONEncoder(allow_nan=False)
_PARTS = DecisionMemo()  # decision -> (placements' JSON, decision's JSON), per GPU uuids


def _decision_parts(decision: Decision, uuids: tuple[str | None, ...]) -> tuple[str, str]:
    return _PARTS.get(decision, uuids, lambda: (_STRICT.encode(_placements_json(decision, uuids)),
                                                _STRICT.encode(_decision_json(decision))))
