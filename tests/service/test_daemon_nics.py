"""The real daemon hands out RDMA NICs with GPUs: each lease's NICs are the ones under its
GPUs' switches, the environment names them, and in exclusive mode no NIC is in two leases,
also after kill -9 and a restart (the stored leases are the record)."""

from __future__ import annotations

import signal

import pytest

from tests.service.daemon_scenario import scrape_metrics
from topod.client import ApiError

QUIET = '[irq]\nmode = "dry-run"\n[probe]\nenabled = false\n'
EXCLUSIVE = QUIET + '[alloc]\nnics = "exclusive"\n'
# pcie-8gpu with one RDMA NIC under each switch of two GPUs
ONE_PER_TWO = [
    {"node": 0, "switches": [{"devices": ["gpu", "gpu", "rdma"]}, {"devices": ["gpu", "gpu", "rdma"]}]},
    {"node": 1, "switches": [{"devices": ["gpu", "gpu", "rdma"]}, {"devices": ["gpu", "gpu", "rdma"]}]},
]


def _nics(lease: dict) -> list[tuple[str, int]]:
    return [(nic["address"], nic["port"]) for p in lease["placements"] for nic in p["nics"]]


def test_seed_host_four_pairs_each_get_the_nics_under_their_switches_and_the_environment(daemon_factory):
    daemon = daemon_factory("h800-8gpu", config=QUIET)
    client = daemon.start()
    switch_of = {d["address"]: d["switch"] for d in client.topology()["pci_devices"]}
    leases = [client.allocate(2, level="good") for _ in range(4)]
    for lease in leases:
        hcas = []
        for placement in lease["placements"]:
            (nic,) = placement["nics"]
            assert nic["level"] == "PIX" and switch_of[nic["address"]] == switch_of[placement["address"]]
            hcas.append(f"{nic['name']}:{nic['port']}")
        env = lease["environment"]
        assert env["NCCL_IB_HCA"] == "=" + ",".join(hcas)
        assert env["UCX_NET_DEVICES"] == ",".join(hcas)
        assert env["TOPOD_GPU_NICS"] == ";".join(f"{p['index']}:{p['nics'][0]['name']}" for p in lease["placements"])
    assert len({key for lease in leases for key in _nics(lease)}) == 8
    status, text = scrape_metrics(daemon.socket)
    assert status == 200
    assert 'topod_nics{state="leased"} 8.0' in text and 'topod_nics{state="free"} 0.0' in text


def test_exclusive_nics_are_never_in_two_leases_across_kill_and_restart(daemon_factory, host_tree):
    daemon = daemon_factory(config=EXCLUSIVE, root=host_tree("pcie-8gpu", root_complex=ONE_PER_TWO))
    client = daemon.start()
    held = [client.allocate(1, level="any", nics_per_gpu=1) for _ in range(4)]
    taken = [key for lease in held for key in _nics(lease)]
    assert len(taken) == 4 == len(set(taken))
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    client = daemon.start()
    assert sorted(key for lease in client.leases() for key in _nics(lease)) == sorted(taken)
    with pytest.raises(ApiError) as caught:
        client.allocate(1, level="any", nics_per_gpu=1)
    assert caught.value.status == 409 and caught.value.code == "insufficient_nics"
    bare = client.allocate(1, level="any")  # best effort: a GPU, no NIC, and no NIC variables
    assert _nics(bare) == [] and "NCCL_IB_HCA" not in bare["environment"]
    status, text = scrape_metrics(daemon.socket)
    assert 'topod_nics{state="leased"} 4.0' in text and 'topod_nics{state="free"} 0.0' in text
    client.release(held[0]["id"])
    again = client.allocate(1, level="any", nics_per_gpu=1)
    assert _nics(again) == _nics(held[0])  # the one NIC set free, and no other
