"""Calibration on host trees: firmware that lies about a GPU's node, degraded pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

from topod.discover import discover
from topod.distance import DistanceModel
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.probe.backend import LinkId, Measurement
from topod.probe.calibrate import CalibrationSettings, calibrate
from topod.probe.linkstate import LinkState
from topod.probe.simulated import SimulatedBackend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "links"
# pcie-8gpu with GPU 3 alone on a root complex of node 1 whose firmware says node 0.
LYING_ROOT_COMPLEXES = [
    {"node": 0, "switches": [{"devices": ["gpu", "gpu"]}, {"devices": ["gpu"]}], "devices": ["rdma", "nvme"]},
    {"node": 1, "bus": 0x28, "devices": [{"kind": "gpu", "firmware_numa_node": 0}]},
    {"node": 1, "bus": 0x30, "switches": [{"devices": ["gpu", "gpu"]}, {"devices": ["gpu", "gpu"]}],
     "devices": ["rdma", "nic"]},
]


def built(tmp_path_factory, name, **overrides):
    spec = load_builtin_spec(name)
    spec.update(overrides)
    return discover(HostRoot(build_host(spec, tmp_path_factory.mktemp(name))), live_nvml=False)


# Topologies are frozen values: one build per module keeps these tests fast.
@pytest.fixture(scope="module")
def lying_host(tmp_path_factory):
    return built(tmp_path_factory, "pcie-8gpu", root_complex=LYING_ROOT_COMPLEXES)


@pytest.fixture(scope="module")
def pcie_host(tmp_path_factory):
    return built(tmp_path_factory, "pcie-8gpu")


def probed(topology, table="pcie-8gpu-gpu3-on-node1.json", rounds=2):
    backend = SimulatedBackend.from_file(FIXTURES / table, topology)
    state = LinkState(backend.links())
    for _ in range(rounds):
        state.fold_cycle([backend.measure(link) for link in state.links])
    return state


def test_gpu3_starts_where_firmware_says(lying_host):
    model = DistanceModel(lying_host)
    assert lying_host.gpu(3).numa_node == 0
    assert (model.gpus(3, 0).label, model.gpus(3, 4).label) == ("NODE", "SYS")


def test_transfers_move_gpu3_to_node1_with_a_warning(lying_host):
    calibration = calibrate(lying_host, probed(lying_host).measurements())
    (finding,) = [f for f in calibration.findings if f.code == "firmware_locality_mismatch"]
    gpu3 = lying_host.gpu(3).address
    assert finding.subject == gpu3 and finding.data["firmware_node"] == 0 and finding.data["measured_node"] == 1
    assert "sysfs says node 0" in finding.reason and "using node 1" in finding.reason
    device = calibration.topology.device(gpu3)
    assert (device.numa_node, device.numa_node_source) == (1, "measured")
    assert device.local_cpus == calibration.topology.node(1).cpus
    assert calibration.topology.gpu(3).numa_node == 1
    warning = calibration.topology.warnings[-1]
    assert warning.code == "firmware_locality_mismatch" and warning.path.endswith(f"{gpu3}/numa_node")
    assert lying_host.gpu(3).numa_node == 0  # the input is left alone


def test_corrected_model_groups_gpu3_with_node1_gpus(lying_host):
    model = DistanceModel(calibrate(lying_host, probed(lying_host).measurements()).topology)
    assert model.gpus(3, 4).label == "NODE" and model.gpus(3, 4).local
    assert model.gpus(3, 0).label == "SYS" and not model.gpus(3, 0).local
    assert all(model.gpus(3, g).level == "NODE" for g in (4, 5, 6, 7))
    assert all(model.gpus(3, g).level == "SYS" for g in (0, 1, 2))


def test_honest_host_is_left_as_discovered(pcie_host):
    topology = pcie_host
    calibration = calibrate(topology, probed(topology, "pcie-8gpu-uplink-degrades.json").measurements())
    assert calibration.findings == () and calibration.topology is topology


def test_a_small_difference_does_not_move_a_device(lying_host):
    gpu3 = lying_host.gpu(3).address
    near = [Measurement(LinkId("h2d", "node0", gpu3), 20.0), Measurement(LinkId("h2d", "node1", gpu3), 24.0)]
    assert calibrate(lying_host, near).findings == ()
    far = [Measurement(LinkId("h2d", "node0", gpu3), 10.0), Measurement(LinkId("h2d", "node1", gpu3), 24.0)]
    assert calibrate(lying_host, far).topology.gpu(3).numa_node == 1
    assert calibrate(lying_host, far, CalibrationSettings(locality_ratio=3.0)).findings == ()


def test_one_node_measured_says_nothing(lying_host):
    gpu3 = lying_host.gpu(3).address
    assert calibrate(lying_host, [Measurement(LinkId("h2d", "node1", gpu3), 24.0)]).findings == ()


def test_a_pair_far_below_its_level_is_reported_degraded(pcie_host):
    topology = pcie_host
    model = DistanceModel(topology)
    gpus = [g.address for g in topology.gpus]
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    slow = next(pair for pair in pairs if model.between(*pair).level == "SYS")
    measurements = [Measurement(LinkId("p2p", a, b), 3.0 if (a, b) == slow else 8.5)
                    for a, b in pairs if model.between(a, b).level == "SYS"]
    (finding,) = calibrate(topology, measurements).findings
    assert finding.code == "link_degraded" and finding.data["level"] == "SYS"
    assert finding.subject == f"{slow[0]} {slow[1]}" and finding.data["expected_gbps"] == 8.5


def test_configured_expectation_overrides_the_peer_median(pcie_host):
    topology = pcie_host
    a, b = topology.gpu(0).address, topology.gpu(1).address
    level = DistanceModel(topology).gpus(0, 1).label
    measurement = [Measurement(LinkId("p2p", a, b), 10.0)]
    assert calibrate(topology, measurement).findings == ()  # one pair: no peers to compare with
    (finding,) = calibrate(topology, measurement, CalibrationSettings(expected_p2p_gbps={level: 25.0})).findings
    assert finding.code == "link_degraded"


@pytest.mark.parametrize("kwargs", [{"locality_ratio": 1.0}, {"degraded_ratio": 1.5}])
def test_bad_calibration_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        CalibrationSettings(**kwargs)
