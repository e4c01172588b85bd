"""GPU-NIC pairing on fixture hosts: 1, 2 and 0 NICs per GPU, a NIC whose port is down,
NICs on the other socket only, and the seed's h800: each lease's NICs are the nearest
free ones, exclusive NICs are never in two leases, the NIC term never beats GPU-GPU cost."""

from __future__ import annotations

import random

import pytest

from topod.alloc.engine import allocate
from topod.alloc.errors import InsufficientNicsError, InvalidRequestError
from topod.alloc.nics import lease_nic_keys, nic_ports_by_state, offered_nics
from topod.alloc.policy import PolicySettings
from topod.alloc.request import FreeState, Request
from topod.discover import discover
from topod.distance import DistanceModel
from topod.host import HostRoot

RC = "root_complex"


def _h800(switch_devices: list[list], extra: dict | None = None) -> dict:
    """The seed's four root complexes (two per node), each with two switches of `switch_devices`."""
    rcs = []
    for index, node in enumerate((0, 0, 1, 1)):
        switches = [{"devices": switch_devices[(2 * index + s) % len(switch_devices)]} for s in range(2)]
        rcs.append({"node": node, "switches": switches, **(extra or {})})
    return {RC: rcs}


TWO_PER_GPU = _h800([["gpu", "rdma", "rdma"]])
NONE = _h800([["gpu"]])
FIRST_DOWN = _h800([["gpu", {"kind": "rdma", "port_state": "DOWN"}]] + [["gpu", "rdma"]] * 7)
OTHER_SOCKET = {RC: [
    {"node": 0, "switches": [{"devices": ["gpu"]}, {"devices": ["gpu"]}]},
    {"node": 0, "switches": [{"devices": ["gpu"]}, {"devices": ["gpu"]}]},
    {"node": 1, "devices": ["rdma", "rdma", "rdma", "rdma"]},
]}
# One NIC per switch of two GPUs (as on many PCIe servers).
ONE_PER_TWO = {"name": "pcie-8gpu", RC: [
    {"node": 0, "switches": [{"devices": ["gpu", "gpu", "rdma"]}, {"devices": ["gpu", "gpu", "rdma"]}]},
    {"node": 1, "switches": [{"devices": ["gpu", "gpu", "rdma"]}, {"devices": ["gpu", "gpu", "rdma"]}]},
]}


@pytest.fixture()
def host_of(host_tree):
    def make(name: str = "h800-8gpu", **overrides: object):
        spec_name = str(overrides.pop("name", name))
        topology = discover(HostRoot(host_tree(spec_name, **overrides)), live_nvml=False)
        return topology, DistanceModel(topology)

    return make


def _switch_of(topology, address: str) -> str | None:
    return topology.device(address).switch


def _grant_all(topology, distances, requests, mode: str, rng: random.Random | None = None):
    """Grant requests in turn (some released at random when rng is given); returns the
    decisions held at the end and every decision made."""
    held: list = []
    made: list = []
    policy = PolicySettings(nics=mode)
    for request in requests:
        if rng is not None and held and rng.random() < 0.3:
            held.pop(rng.randrange(len(held)))
        state = FreeState(busy_gpus=frozenset(g for d in held for g in d.gpus),
                          busy_nics=frozenset(k for d in held for k in lease_nic_keys(d.placements)))
        try:
            decision = allocate(topology, distances, state, request, policy)
        except Exception:  # noqa: BLE001 - a refused request holds nothing
            continue
        held.append(decision)
        made.append((decision, state))
    return held, made


@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_seed_host_four_two_gpu_leases_get_the_nics_under_their_switches(host_of, mode):
    topology, distances = host_of("h800-8gpu")
    held, _ = _grant_all(topology, distances, [Request(gpus=2)] * 4, mode)
    assert len(held) == 4
    seen = []
    for decision in held:
        for placement in decision.placements:
            (nic,) = placement.nics
            assert nic.level == "PIX"
            assert _switch_of(topology, nic.address) == _switch_of(topology, placement.address)
            assert nic.name.startswith("mlx5_") and nic.port == 1
            seen.append(nic.key)
    assert len(set(seen)) == 8  # every NIC of the host, each once


def test_exclusive_nics_are_never_in_two_leases_under_churn(host_of):
    topology, distances = host_of(**ONE_PER_TWO)
    rng = random.Random(27)
    requests = [Request(gpus=rng.choice([1, 1, 2, 3]), nics_per_gpu=rng.choice([None, None, 1]))
                for _ in range(200)]
    held, made = _grant_all(topology, distances, requests, "exclusive", rng)
    assert len(made) > 40
    for decision, state in made:
        keys = [nic.key for p in decision.placements for nic in p.nics]
        assert len(keys) == len(set(keys)), "a NIC twice in one lease"
        assert not set(keys) & state.busy_nics, "a NIC already leased given again"
    final = [k for d in held for k in lease_nic_keys(d.placements)]
    assert len(final) == len(set(final))


def test_exclusive_strict_request_waits_when_nics_are_taken_and_best_effort_says_why(host_of):
    topology, distances = host_of(**ONE_PER_TWO)
    held, _ = _grant_all(topology, distances, [Request(gpus=1, nics_per_gpu=1)] * 4, "exclusive")
    assert sorted(k for d in held for k in lease_nic_keys(d.placements)) == sorted(
        nic.key for nic in offered_nics(topology))
    state = FreeState(busy_gpus=frozenset(g for d in held for g in d.gpus),
                      busy_nics=frozenset(k for d in held for k in lease_nic_keys(d.placements)))
    with pytest.raises(InsufficientNicsError) as caught:
        allocate(topology, distances, state, Request(gpus=1, nics_per_gpu=1), PolicySettings(nics="exclusive"))
    assert caught.value.retryable and "0 of the host's 4 are free" in str(caught.value)
    best_effort = allocate(topology, distances, state, Request(gpus=1), PolicySettings(nics="exclusive"))
    assert best_effort.placements[0].nics == ()
    assert any("no free RDMA NIC for GPU" in reason for reason in best_effort.reasons)
    with pytest.raises(InsufficientNicsError) as never:
        allocate(topology, distances, FreeState(), Request(gpus=3, nics_per_gpu=2), PolicySettings(nics="exclusive"))
    assert not never.value.retryable


def test_one_nic_per_two_gpus_shared_gives_both_gpus_their_switch_nic(host_of):
    topology, distances = host_of(**ONE_PER_TWO)
    decision = allocate(topology, distances, FreeState(), Request(gpus=2), PolicySettings(nics="shared"))
    (a,), (b,) = (p.nics for p in decision.placements)
    assert a == b and a.level == "PIX"
    assert _switch_of(topology, a.address) == _switch_of(topology, decision.placements[0].address)


def test_two_nics_per_gpu_are_both_under_its_switch(host_of):
    topology, distances = host_of(**TWO_PER_GPU)
    assert len(offered_nics(topology)) == 16
    for mode in ("shared", "exclusive"):
        held, _ = _grant_all(topology, distances, [Request(gpus=2, nics_per_gpu=2)] * 4, mode)
        assert len(held) == 4
        keys = []
        for decision in held:
            for placement in decision.placements:
                assert len(placement.nics) == 2
                for nic in placement.nics:
                    assert nic.level == "PIX"
                    assert _switch_of(topology, nic.address) == _switch_of(topology, placement.address)
                    keys.append(nic.key)
        assert len(set(keys)) == 16
    default = allocate(topology, distances, FreeState(), Request(gpus=1), PolicySettings())
    assert len(default.placements[0].nics) == 1  # the nearest one unless more are asked for


def test_host_without_nics_leases_carry_none_and_a_required_nic_is_refused(host_of):
    topology, distances = host_of(**NONE)
    assert offered_nics(topology) == ()
    decision = allocate(topology, distances, FreeState(), Request(gpus=2), PolicySettings(nics="exclusive"))
    assert all(p.nics == () for p in decision.placements)
    with pytest.raises(InsufficientNicsError) as caught:
        allocate(topology, distances, FreeState(), Request(gpus=2, nics_per_gpu=1), PolicySettings())
    assert not caught.value.retryable and "no RDMA NIC with an active port" in str(caught.value)


def test_a_down_port_is_not_offered_and_no_lease_takes_another_gpus_own_nic(host_of):
    topology, distances = host_of(**FIRST_DOWN)
    down = topology.devices_of_kind("rdma")[0]
    assert [p.state for p in down.rdma_ports] == ["DOWN"]
    assert down.address not in {nic.address for nic in offered_nics(topology)}
    assert nic_ports_by_state(topology, ()) == {"free": 7, "leased": 0, "down": 1}
    gpu0 = next(g for g in topology.gpus if _switch_of(topology, g.address) == down.switch)
    first = allocate(topology, distances, FreeState(), Request(gpus=1), PolicySettings(nics="exclusive"))
    assert first.gpus != (gpu0.index,)  # among equal GPUs, one with its NIC up
    held, _ = _grant_all(topology, distances, [Request(gpus=1)] * 8, "exclusive")
    by_gpu = {d.gpus[0]: d.placements[0].nics for d in held}
    assert len(by_gpu) == 8 and by_gpu[gpu0.index] == ()  # rather none than another GPU's own
    for index, nics in by_gpu.items():
        if index != gpu0.index:
            (nic,) = nics
            assert nic.level == "PIX" and nic.address != down.address
    shared, _ = _grant_all(topology, distances, [Request(gpus=1)] * 8, "shared")
    (nic,) = next(d for d in shared if d.gpus == (gpu0.index,)).placements[0].nics
    assert nic.level == "PHB"  # the other switch's NIC on the same root complex
    alone = allocate(topology, distances, FreeState(busy_gpus=frozenset(g.index for g in topology.gpus
                                                                          if g.index != gpu0.index)),
                     Request(gpus=1, nics_per_gpu=1), PolicySettings(nics="exclusive"))
    (taken,) = alone.placements[0].nics  # asked for: the nearest free one, whoever's it is
    assert taken.level == "PHB"
    assert any("not under the PCIe switch of GPU" in reason for reason in alone.reasons)


def test_nics_on_the_other_socket_only_are_given_at_sys_level(host_of):
    topology, distances = host_of(**OTHER_SOCKET)
    assert {g.numa_node for g in topology.gpus} == {0}
    assert {nic.numa_node for nic in offered_nics(topology)} == {1}
    held, _ = _grant_all(topology, distances, [Request(gpus=2)] * 2, "exclusive")
    levels = {nic.level for d in held for p in d.placements for nic in p.nics}
    assert levels == {"SYS"}
    keys = [k for d in held for k in lease_nic_keys(d.placements)]
    assert len(keys) == 4 == len(set(keys))


def test_nic_distance_never_outweighs_gpu_gpu_cost(host_of):
    # switch A: two GPUs, no NIC; switches B and C: one GPU and one NIC each, all on one
    # root complex. {A0, A1} is a PIX pair with PHB NICs; {B, C} has PIX NICs but is PHB.
    topology, distances = host_of("pcie-8gpu", root_complex=[
        {"node": 0, "switches": [{"devices": ["gpu", "gpu"]}, {"devices": ["gpu", "rdma"]},
                                 {"devices": ["gpu", "rdma"]}]}])
    for mode, request in (("shared", Request(gpus=2)), ("exclusive", Request(gpus=2, nics_per_gpu=1))):
        decision = allocate(topology, distances, FreeState(), request, PolicySettings(nics=mode))
        switches = {_switch_of(topology, p.address) for p in decision.placements}
        assert len(switches) == 1 and decision.performance.weakest_pair == "PIX"
        assert {nic.level for p in decision.placements for nic in p.nics} == {"PHB"}


def test_mode_none_gives_no_nics_and_refuses_asking_for_them(host_of):
    topology, distances = host_of("h800-8gpu")
    decision = allocate(topology, distances, FreeState(), Request(gpus=2), PolicySettings(nics="none"))
    assert all(p.nics == () for p in decision.placements)
    with pytest.raises(InvalidRequestError, match="nics_per_gpu"):
        allocate(topology, distances, FreeState(), Request(gpus=2, nics_per_gpu=1), PolicySettings(nics="none"))
    zero = allocate(topology, distances, FreeState(), Request(gpus=2, nics_per_gpu=0), PolicySettings())
    assert all(p.nics == () for p in zero.placements)
