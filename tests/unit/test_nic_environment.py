"""The environment a lease's NICs give a job, read back the way NCCL and UCX document
their variables, and the lease JSON that carries the NICs (old rows without them load)."""

from __future__ import annotations

import re

import pytest

from topod.alloc.nics import NicChoice, nic_environment, rank_nic_environment
from topod.alloc.request import Decision, Performance, Placement
from topod.service.lease import Lease

NIC0 = NicChoice("mlx5_0", "0000:14:00.0", 1, "PIX")
NIC1 = NicChoice("mlx5_1", "0000:18:00.0", 1, "PIX")
NIC10 = NicChoice("mlx5_10", "0000:9a:00.0", 2, "PHB")


def parse_nccl_ib_hca(value: str) -> tuple[bool, list[tuple[str, int | None]]]:
    """NCCL's NCCL_IB_HCA: an optional '^' (exclude) or '=' (exact match) prefix, then a
    comma-separated list of `name[:port]`."""
    exact = value.startswith("=")
    assert not value.startswith("^"), "a lease lists the NICs to use, never ones to avoid"
    body = value[1:] if exact else value
    out = []
    for item in body.split(","):
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?::(\d+))?", item)
        assert match, f"{item!r} is not name[:port]"
        out.append((match.group(1), int(match.group(2)) if match.group(2) else None))
    return exact, out


def parse_ucx_net_devices(value: str) -> list[tuple[str, int]]:
    """UCX's UCX_NET_DEVICES: comma-separated `device:port` (RDMA devices carry a port)."""
    out = []
    for item in value.split(","):
        match = re.fullmatch(r"([A-Za-z0-9_.-]+):(\d+)", item)
        assert match, f"{item!r} is not dev:port"
        out.append((match.group(1), int(match.group(2))))
    return out


def _placement(index: int, *nics: NicChoice) -> Placement:
    return Placement(index, f"0000:{0x10 + index:02x}:00.0", 0, (index,), 0, tuple(nics))


def test_environment_names_the_lease_nics_as_nccl_and_ucx_parse_them():
    env = nic_environment([_placement(0, NIC0), _placement(1, NIC1, NIC10)])
    exact, hcas = parse_nccl_ib_hca(env["NCCL_IB_HCA"])
    assert exact  # '=': mlx5_1 must not also select mlx5_10
    assert hcas == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_10", 2)]
    assert parse_ucx_net_devices(env["UCX_NET_DEVICES"]) == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_10", 2)]
    per_gpu = dict(entry.split(":", 1) for entry in env["TOPOD_GPU_NICS"].split(";"))
    assert per_gpu == {"0": "mlx5_0", "1": "mlx5_1,mlx5_10:2"}
    for entry in per_gpu.values():  # each rank's own list is itself an NCCL_IB_HCA value
        assert parse_nccl_ib_hca("=" + entry)[1]


def test_a_nic_shared_by_two_gpus_is_listed_once_and_no_nics_means_no_variables():
    env = nic_environment([_placement(0, NIC0), _placement(1, NIC0)])
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert env["TOPOD_GPU_NICS"] == "0:mlx5_0;1:mlx5_0"
    assert nic_environment([_placement(0), _placement(1)]) == {}


def _lease(placements: tuple[Placement, ...]) -> Lease:
    decision = Decision(gpus=tuple(p.index for p in placements), placements=placements,
                        cpus={p.index: p.cpus for p in placements}, memory_nodes=(0,), numa_nodes=(0,), cost=1.0,
                        best_cost=1.0, level="best", requested_level="good", satisfaction=1.0,
                        performance=Performance(1.0, None, None, {}), exact=True, cpu_fallback=False)
    return Lease(id="abc", state="active", owner_uid=0, owner_gid=0, requester_pid=1, owner_pid=None,
                 owner_start_time=None, job=None, priority=0, preemptible=False, decision=decision,
                 gpu_uuids=(None,) * len(placements), environment={}, created=1.0, expires=None, ttl_seconds=None)


def test_lease_json_carries_each_placements_nics_and_reads_them_back():
    lease = _lease((_placement(0, NIC0), _placement(1, NIC1, NIC10)))
    body = lease.to_json()
    assert body["placements"][1]["nics"] == [
        {"name": "mlx5_1", "address": "0000:18:00.0", "port": 1, "level": "PIX"},
        {"name": "mlx5_10", "address": "0000:9a:00.0", "port": 2, "level": "PHB"}]
    again = Lease.from_json(body)
    assert again.decision.placements == lease.decision.placements


@pytest.mark.parametrize("strip", ["absent", "null"])
def test_a_lease_row_from_before_nics_still_loads_with_none(strip):
    body = _lease((_placement(0, NIC0),)).to_json()
    for placement in body["placements"]:
        if strip == "absent":
            del placement["nics"]
        else:
            placement["nics"] = None
    assert Lease.from_json(body).decision.placements[0].nics == ()


def test_a_rank_is_narrowed_to_its_own_gpus_nics():
    spec = nic_environment([_placement(4, NIC0), _placement(5, NIC1, NIC10)])["TOPOD_GPU_NICS"]
    own = rank_nic_environment(spec, "5")
    assert parse_nccl_ib_hca(own["NCCL_IB_HCA"]) == (True, [("mlx5_1", 1), ("mlx5_10", 2)])
    assert parse_ucx_net_devices(own["UCX_NET_DEVICES"]) == [("mlx5_1", 1), ("mlx5_10", 2)]
    assert rank_nic_environment(spec, "4") == {"NCCL_IB_HCA": "=mlx5_0:1", "UCX_NET_DEVICES": "mlx5_0:1"}
    assert rank_nic_environment(spec, "6") == {}  # a GPU not in the lease: the lease-wide values stay
    assert rank_nic_environment("", "0") == {}
