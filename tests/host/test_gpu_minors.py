"""GPU device minors: /dev/nvidiaN is the driver's minor, not NVML's index.

pcie-8gpu's driver numbered its GPUs against bus order ([driver] minors = "reversed"):
NVML GPU 0 (0000:13:00.0) is /dev/nvidia7. gres.conf File=, the topology JSON and
doctor's fd -> GPU mapping must follow the minor; where it is unknown they fall back to
the index and say so (gpu_minor_unknown).
"""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest

from topod.cli.topoctl import main
from topod.discover import discover
from topod.discover.gpuminor import assign_minors, parse_device_minor, read_driver_minors
from topod.discover.notes import Notes
from topod.discover.nvml import live_minor_number, parse_nvml_json
from topod.export.slurm import gres_lines, render_gres_conf
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.snapshot import write_snapshot
from topod.topojson import topology_to_json

INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 563
GPU UUID: \t GPU-5d2c41b8-8b2f-2b43-2c8a-0e1c2b5e3a11
Video BIOS: \t 96.00.74.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:17:00.0
Device Minor: \t 3
GPU Excluded:\t No
"""
NO_MINORS = {"minors": "reversed", "information": False, "nvml_minor_number": False}


def _gres_rows(text: str) -> list[dict[str, str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = dict(token.split("=", 1) for token in line.split())
        if "Name" in fields:
            rows.append(fields)
    return rows


@pytest.fixture()
def tmp_tree(tmp_path):
    """tmp_tree(name, **overrides): a fresh tree of a built-in host with spec overrides,
    in its own directory (nothing left from another variant)."""

    def make(name: str, **overrides):
        spec = load_builtin_spec(name)
        spec.update(overrides)
        return build_host(spec, tmp_path / f"{name}-custom")

    return make


def _codes(topology) -> list[str]:
    return [w.code for w in topology.warnings]


# --- parsing -------------------------------------------------------------------------

def test_device_minor_is_read_from_the_drivers_information_text():
    assert parse_device_minor(INFORMATION) == 3
    assert parse_device_minor("Model: x\nBus Location: 0000:17:00.0\n") is None


@pytest.mark.parametrize("text", ["Device Minor: -1\n", "Device Minor: three\n", "Device Minor:\n",
                                  "Device Minor: 99999999999999\n"])
def test_a_malformed_device_minor_is_an_error_not_a_guess(text):
    with pytest.raises(ValueError, match="Device Minor"):
        parse_device_minor(text)


def test_nvml_json_minor_number_is_optional_and_checked():
    base = {"index": 0, "pci_bus_id": "00000000:17:00.0"}
    assert parse_nvml_json(json.dumps({"gpus": [base]})).gpus[0].minor_number is None
    assert parse_nvml_json(json.dumps({"gpus": [{**base, "minor_number": 5}]})).gpus[0].minor_number == 5
    for bad in (-1, "5", True, 1.5):
        with pytest.raises(ValueError, match=r"gpus\[0\].minor_number"):
            parse_nvml_json(json.dumps({"gpus": [{**base, "minor_number": bad}]}))


def test_live_minor_number_is_guarded():
    class Binding:
        @staticmethod
        def nvmlDeviceGetMinorNumber(handle):
            return {"a": 6}[handle]

    class Failing:
        @staticmethod
        def nvmlDeviceGetMinorNumber(handle):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    assert live_minor_number(Binding, "a") == 6
    assert live_minor_number(Failing, "a") is None
    assert live_minor_number(object(), "a") is None  # a binding without the call


# --- discovery -----------------------------------------------------------------------

def test_fixture_minors_differ_from_indices_and_discovery_reads_them(readonly_host):
    host, topology = readonly_host("pcie-8gpu")
    assert [g.index for g in topology.gpus] == list(range(8))
    assert [g.minor for g in topology.gpus] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert topology.gpu(0).device_file == "/dev/nvidia7"
    assert read_driver_minors(host)["0000:13:00.0"] == 7
    assert "gpu_minor_unknown" not in _codes(topology)
    gpus = topology_to_json(topology)["gpus"]
    assert [(g["index"], g["minor"]) for g in gpus][:2] == [(0, 7), (1, 6)]


def test_identity_hosts_keep_minor_equal_to_index(readonly_host):
    _, topology = readonly_host("h800-8gpu")
    assert [g.minor for g in topology.gpus] == [g.index for g in topology.gpus]


def test_nvml_minor_number_is_used_when_the_driver_files_are_absent(tmp_tree):
    root = tmp_tree("pcie-8gpu", driver={"minors": "reversed", "information": False})
    topology = discover(HostRoot(root), live_nvml=False)
    assert [g.minor for g in topology.gpus] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert "gpu_minor_unknown" not in _codes(topology)


def test_unknown_minor_falls_back_to_the_index_with_a_warning(tmp_tree):
    topology = discover(HostRoot(tmp_tree("pcie-8gpu", driver=NO_MINORS)), live_nvml=False)
    assert all(g.minor is None for g in topology.gpus)
    assert [g.device_file for g in topology.gpus][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    warning = next(w for w in topology.warnings if w.code == "gpu_minor_unknown")
    assert "0,1,2,3,4,5,6,7" in warning.reason and warning.path == "proc/driver/nvidia/gpus"
    assert topology_to_json(topology)["gpus"][0]["minor"] is None


def test_driver_and_nvml_disagreeing_keeps_the_drivers_minor_and_says_so(readonly_host):
    _, topology = readonly_host("pcie-8gpu")
    notes = Notes()
    gpus = assign_minors(list(topology.gpus[:2]), {"0000:13:00.0": 7, "0000:14:00.0": 6},
                         {"0000:13:00.0": 1}, notes)
    assert [g.minor for g in gpus] == [7, 6]
    assert [w.code for w in notes.items] == ["gpu_minor_mismatch"]


def test_a_garbage_information_file_is_warned_and_skipped(tmp_tree):
    root = tmp_tree("pcie-8gpu", driver={"minors": "reversed", "nvml_minor_number": False})
    (root / "proc/driver/nvidia/gpus/0000:13:00.0/information").write_text("Device Minor: x\n")
    topology = discover(HostRoot(root), live_nvml=False)
    assert topology.gpu(0).minor is None and topology.gpu(1).minor == 6
    assert {"bad_value", "gpu_minor_unknown"} <= set(_codes(topology))


def test_snapshot_carries_the_minors_and_huge_pages(tmp_tree, tmp_path):
    root = tmp_tree("pcie-8gpu", driver={"minors": "reversed", "nvml_minor_number": False})
    out = tmp_path / "s.tar.gz"
    write_snapshot(HostRoot(root), str(out), "s")
    with tarfile.open(out) as archive:
        names = set(archive.getnames())
        archive.extractall(tmp_path / "x", filter="tar")
    assert "s/proc/driver/nvidia/gpus/0000:13:00.0/information" in names
    assert "s/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages" in names
    copied = discover(HostRoot(tmp_path / "x" / "s"), live_nvml=False)
    assert [g.minor for g in copied.gpus] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert copied.node(0).hugepages[2048].total == 1024


# --- slurm gres.conf -----------------------------------------------------------------

def test_gres_file_names_the_device_minor_not_the_index(readonly_host):
    _, topology = readonly_host("pcie-8gpu")
    rows = _gres_rows(render_gres_conf(topology))
    # Lines in bus order: GPU 0 (0000:13:00.0) first, and its device is /dev/nvidia7.
    assert [row["File"] for row in rows] == [f"/dev/nvidia{n}" for n in (7, 6, 5, 4, 3, 2, 1, 0)]
    assert "gpu_minor_unknown" not in render_gres_conf(topology)
    assert [line.index for line in gres_lines(topology)] == list(range(8))


def test_gres_with_unknown_minors_uses_indices_and_warns_in_the_file(tmp_tree):
    topology = discover(HostRoot(tmp_tree("pcie-8gpu", driver=NO_MINORS)), live_nvml=False)
    text = render_gres_conf(topology)
    assert [row["File"] for row in _gres_rows(text)] == [f"/dev/nvidia{n}" for n in range(8)]
    assert "# WARNING gpu_minor_unknown" in text


def test_export_slurm_gres_device_dir_and_stderr_warning(host_tree, capsys):
    root = str(host_tree("pcie-8gpu"))
    assert main(["export", "slurm-gres", "--root", root, "--device-dir", "/run/fake-dev/"]) == 0
    captured = capsys.readouterr()
    assert _gres_rows(captured.out)[0]["File"] == "/run/fake-dev/nvidia7"
    assert "gpu_minor_unknown" not in captured.err
    assert main(["export", "slurm-gres", "--root", root, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["gres"][0]
    assert (row["file"], row["index"], row["minor_known"]) == ("/dev/nvidia7", 0, True)


def test_export_slurm_gres_warns_on_stderr_when_minors_are_unknown(tmp_tree, capsys):
    root = str(tmp_tree("pcie-8gpu", driver=NO_MINORS))
    assert main(["export", "slurm-gres", "--root", root]) == 0
    err = capsys.readouterr().err
    assert "topoctl: warning: [gpu_minor_unknown]" in err
    assert main(["export", "slurm-gres", "--root", root, "--json"]) == 0
    captured = capsys.readouterr()
    warnings = [json.loads(line) for line in captured.err.splitlines() if '"warning"' in line]
    assert warnings and warnings[0]["warning"]["code"] == "gpu_minor_unknown"
    assert json.loads(captured.out)["gres"][0]["minor_known"] is False


# --- doctor --------------------------------------------------------------------------

def test_doctor_maps_an_open_dev_nvidia_to_the_gpu_with_that_minor(host_tree):
    from topod.doctor import diagnose
    from topod.hostspec.doctor_scene import well_placed_rank, write_process

    root = host_tree("pcie-8gpu")
    host = HostRoot(root)
    topology = discover(host, live_nvml=False)
    spec = well_placed_rank(topology, 4242, 0)
    assert spec.gpus == (7,)  # GPU 0's process holds /dev/nvidia7
    write_process(root, spec)
    for name in ("driver_files", "nvml_only"):
        report = diagnose(host, topology)
        job = next(p.job for p in report.processes if p.job.process.pid == 4242)
        assert (job.gpus, job.gpu_source) == ((0,), "fd"), name
        # Without the driver's files, doctor maps through the topology's (NVML) minors.
        shutil.rmtree(root / "proc/driver", ignore_errors=True)
