"""Each doctor rule on a fixture host read through HostRoot: it fires on the fault, stays
quiet on a well-placed rank, names the files it read and gives a concrete fix."""

import shutil

import pytest

from topod.cpulist import format_cpulist, parse_cpulist
from topod.discover import discover
from topod.doctor import DoctorInputError, diagnose
from topod.hostspec.doctor_scene import (
    far_socket_rank,
    ht_split_pair,
    isolated_misuse_rank,
    migrating_rank,
    place_irqs,
    set_isolated,
    spread_job,
    well_placed_rank,
    write_process,
    wrong_node_memory_rank,
)
from topod.host import HostRoot
from topod.hostspec import build_host, load_builtin_spec
from topod.record import replace


@pytest.fixture(scope="module")
def base_h800(tmp_path_factory):
    """h800-8gpu built and discovered once: the rules under test only change /proc."""
    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path_factory.mktemp("doctor") / "h800-8gpu")
    return root, discover(HostRoot(root))


@pytest.fixture()
def h800(base_h800, tmp_path):
    """A fresh host root per test: its own copy of proc/, the base tree's sys/ and dev/."""
    base, topology = base_h800
    root = tmp_path / "h800-8gpu"
    root.mkdir()
    shutil.copytree(base / "proc", root / "proc", ignore=shutil.ignore_patterns("irq"))
    for name in ("sys", "dev", "nvml.json", "proc/irq"):
        (root / name).symlink_to(base / name)
    return root, topology


def own_irqs(root):
    """Replace the shared proc/irq with a copy this test may change."""
    shared = (root / "proc/irq").resolve()
    (root / "proc/irq").unlink()
    shutil.copytree(shared, root / "proc/irq")


def isolating(topology, cpus):
    """The discovered topology with these CPUs isolated (the base tree's sys/ is shared)."""
    return replace(topology, cpus=tuple(replace(c, isolated=c.id in cpus) for c in topology.cpus))


def run(root, topology=None, **kwargs):
    host = HostRoot(root)
    return diagnose(host, topology or discover(host), **kwargs)


def codes(report, pid=None):
    return [f.code for f in report.findings if pid is None or f.pid == pid]


def only(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, [f.code for f in report.findings]
    return found[0]


def test_well_placed_rank_has_no_findings(h800):
    root, topology = h800
    write_process(root, well_placed_rank(topology, 4100, 0))
    report = run(root, topology)
    assert [p.job.process.pid for p in report.processes] == [4100]
    assert report.findings == [] and report.healthy


def test_rank_on_the_far_socket_is_an_error_naming_threads_and_gpu_files(h800):
    root, topology = h800
    write_process(root, far_socket_rank(topology, 4130, 3))
    finding = only(run(root, topology), "gpu_remote_cpu")
    assert finding.severity == "error" and finding.evidence["gpu_numa_nodes"] == [0]
    assert "/proc/4130/task/*/stat" in finding.files_read
    assert "/sys/bus/pci/devices/0000:37:00.0/numa_node" in finding.files_read
    assert finding.fix.startswith("taskset -a -pc ") and "numactl --cpunodebind=0 --membind=0" in finding.fix
    target = finding.fix.split()[3]
    node0 = set(topology.node(0).cpus)
    assert set(parse_cpulist(target)) <= node0 and 0 not in parse_cpulist(target)  # CPU 0 takes the IRQs


def test_fix_for_a_stray_rank_avoids_other_ranks_cores(h800):
    root, topology = h800
    write_process(root, well_placed_rank(topology, 4100, 0))
    write_process(root, far_socket_rank(topology, 4130, 3))
    finding = only(run(root, topology, pids=[4130]), "gpu_remote_cpu")
    taken = set(well_placed_rank(topology, 4100, 0).cpus_allowed)
    assert not set(parse_cpulist(finding.fix.split()[3])) & taken


def test_memory_on_the_wrong_node_says_how_much_and_how_to_move_it(h800):
    root, topology = h800
    write_process(root, wrong_node_memory_rank(topology, 4200, 1))
    report = run(root, topology)
    finding = only(report, "memory_remote")
    assert "gpu_remote_cpu" not in codes(report)
    assert finding.evidence["memory_mib_by_node"] == {"0": 256, "1": 1792}
    assert finding.fix.startswith("migratepages 4200 1 0") and "numactl --membind=0" in finding.fix
    assert "/proc/4200/numa_maps" in finding.files_read


def test_small_remote_memory_is_not_flagged(h800):
    root, topology = h800
    spec = well_placed_rank(topology, 4201, 1)
    write_process(root, replace(spec, memory_mib={0: 4000, 1: 32}))
    assert "memory_remote" not in codes(run(root, topology))


def test_threads_free_to_migrate_across_sockets(h800):
    root, topology = h800
    write_process(root, migrating_rank(topology, 4300, 2))
    finding = only(run(root, topology), "threads_free_to_migrate")
    assert finding.severity == "warning" and finding.evidence["numa_nodes"] == [0, 1]
    assert finding.evidence["sockets"] == [0, 1]
    assert finding.fix.startswith("taskset -a -pc ") and "/proc/4300/status" in finding.files_read


def test_rdma_irqs_on_a_ranks_cores_judged_by_affinity_when_rates_are_absent(h800):
    root, topology = h800
    spec = well_placed_rank(topology, 4400, 0)
    write_process(root, spec)
    nic = topology.device("0000:14:00.0")
    own_irqs(root)
    place_irqs(root, nic.msi_irqs, list(spec.cpus_allowed[:1]))
    finding = only(run(root, topology), "irq_on_cores")
    assert finding.severity == "warning" and "judged by affinity only" in finding.message
    assert finding.evidence["irqs"] == list(nic.msi_irqs) and finding.evidence["rate_per_s"] is None
    assert f"/proc/irq/{nic.msi_irqs[0]}/effective_affinity_list" in finding.files_read
    assert "smp_affinity_list" in finding.fix and "mlx5_0" in finding.message
    target = finding.evidence["target_cpus"]
    assert not set(parse_cpulist(target)) & set(spec.cpus_allowed)


def test_irq_rates_from_two_snapshots_make_a_busy_irq_an_error(h800):
    root, topology = h800
    spec = well_placed_rank(topology, 4401, 0)
    write_process(root, spec)
    nic = topology.device("0000:14:00.0")
    cpu = spec.cpus_allowed[0]
    own_irqs(root)
    place_irqs(root, nic.msi_irqs, [cpu])
    irq = nic.msi_irqs[1]
    header = f"      CPU{cpu}\n"
    before, after = header + f"{irq}: 0 x\n", header + f"{irq}: 50000 x\n"
    finding = only(run(root, topology, interrupts=(before, after, 10.0)), "irq_on_cores")
    assert finding.severity == "error" and finding.evidence["rate_per_s"] == 5000.0
    assert "/proc/interrupts" in finding.files_read


def test_irq_fix_uses_the_irq_plan_when_given(h800):
    root, topology = h800
    spec = well_placed_rank(topology, 4402, 0)
    write_process(root, spec)
    nic = topology.device("0000:14:00.0")
    own_irqs(root)
    place_irqs(root, nic.msi_irqs, [spec.cpus_allowed[0]])
    finding = only(run(root, topology, irq_plan={str(i): [14, 15] for i in nic.msi_irqs}), "irq_on_cores")
    assert "echo 14-15 > /proc/irq/$irq/smp_affinity_list" in finding.fix and "IRQ plan" in finding.fix


def test_nvme_irq_fix_mentions_managed_vectors(h800):
    root, topology = h800
    spec = well_placed_rank(topology, 4403, 0)
    write_process(root, spec)
    nvme = topology.device("0000:19:00.0")
    own_irqs(root)
    place_irqs(root, nvme.msi_irqs, [spec.cpus_allowed[0]])
    finding = only(run(root, topology), "irq_on_cores")
    assert finding.evidence["kind"] == "nvme" and "isolcpus=managed_irq" in finding.fix


def test_gpus_spread_across_nodes_while_a_tighter_set_is_free(h800):
    root, topology = h800
    write_process(root, spread_job(topology, 4500, (1, 5)))
    finding = only(run(root, topology), "gpus_spread")
    assert finding.evidence["numa_nodes"] == [0, 1]
    assert len(finding.evidence["tighter_numa_nodes"]) == 1
    assert finding.fix.startswith("topoctl run --gpus 2 --level good -- ")
    assert "CUDA_VISIBLE_DEVICES=" in finding.fix
    assert "/sys/bus/pci/devices/0000:17:00.0/numa_node" in finding.files_read


def test_gpus_spread_is_quiet_when_no_tighter_set_is_free(h800):
    root, topology = h800
    write_process(root, spread_job(topology, 4500, (1, 5)))
    leases = [{"id": "L9", "owner": "bob", "gpus": [0, 2, 3, 4, 6, 7], "cpus": [], "pids": []}]
    assert "gpus_spread" not in codes(run(root, topology, leases=leases))


def test_a_spread_lease_is_reported_once_for_all_its_ranks(tmp_path):
    root = build_host(load_builtin_spec("pcie-8gpu"), tmp_path / "pcie-8gpu")
    topology = discover(HostRoot(root))
    write_process(root, well_placed_rank(topology, 4600, 0))
    write_process(root, well_placed_rank(topology, 4610, 4))
    leases = [{"id": "L1", "owner": "alice", "gpus": [0, 4], "cpus": [], "pids": [4600, 4610]}]
    report = run(root, topology, leases=leases)
    finding = only(report, "gpus_spread")
    assert finding.lease == "L1" and finding.fix.startswith("release lease L1")


def test_hyper_thread_siblings_split_between_two_jobs(h800):
    root, topology = h800
    a, b = ht_split_pair(topology, 4700, 4710, 0, 1)
    write_process(root, a)
    write_process(root, b)
    report = run(root, topology)
    split = [f for f in report.findings if f.code == "ht_siblings_split"]
    assert {f.pid for f in split} == {4700, 4710}
    mine = next(f for f in split if f.pid == 4700)
    assert [a.cpus_allowed[0], b.cpus_allowed[0]] in mine.evidence["pairs"]
    assert f"/sys/devices/system/cpu/cpu{a.cpus_allowed[0]}/topology/thread_siblings_list" in mine.files_read


def test_siblings_split_with_another_lease_names_the_lease(h800):
    root, topology = h800
    a, b = ht_split_pair(topology, 4700, 4710, 0, 1)
    write_process(root, a)
    leases = [{"id": "L2", "owner": "bob", "gpus": [1], "cpus": list(b.cpus_allowed), "pids": []}]
    finding = only(run(root, topology, leases=leases), "ht_siblings_split")
    assert finding.evidence["other_jobs"] == ["lease L2 (bob)"]


def test_isolated_cpus_read_from_sysfs_without_lease_data_is_a_note_and_stacked_threads_warn(tmp_path):
    # Its own tree: this test writes sys/devices/system/cpu/isolated.
    root = build_host(load_builtin_spec("h800-8gpu"), tmp_path / "h800-8gpu")
    isolated = [12, 13, 14, 15]
    set_isolated(root, isolated)
    topology = discover(HostRoot(root))
    write_process(root, isolated_misuse_rank(topology, 4800, 0, isolated))
    found = [f for f in run(root, topology).findings if f.code == "isolated_cpus_misused"]
    assert sorted(f.severity for f in found) == ["info", "warning"]
    stacked = next(f for f in found if f.severity == "warning")
    assert "taskset -pc 13 4801" in stacked.fix and "/sys/devices/system/cpu/isolated" in stacked.files_read


def test_isolated_cpus_no_lease_holds_are_a_warning_when_leases_are_known(h800):
    root, topology = h800
    isolated = [12, 13, 14, 15]
    write_process(root, isolated_misuse_rank(topology, 4800, 0, isolated))
    found = [f for f in run(root, isolating(topology, isolated), leases=[]).findings
             if f.code == "isolated_cpus_misused" and "no lease holds them" in f.message]
    assert [f.severity for f in found] == ["warning"]


def test_isolated_cpus_of_another_lease_is_an_error(h800):
    root, topology = h800
    isolated = [12, 13, 14, 15]
    write_process(root, isolated_misuse_rank(topology, 4800, 0, isolated))
    leases = [{"id": "L3", "owner": "carol", "gpus": [2], "cpus": isolated, "pids": []}]
    found = run(root, isolating(topology, isolated), leases=leases).findings
    error = next(f for f in found if f.code == "isolated_cpus_misused" and f.severity == "error")
    assert "lease L3 (carol)" in error.message and error.pid == 4800


def test_isolated_cpus_inside_its_own_lease_are_fine(h800):
    root, topology = h800
    isolated = [12, 13, 14, 15]
    write_process(root, isolated_misuse_rank(topology, 4800, 0, isolated))
    leases = [{"id": "L4", "owner": "dan", "gpus": [0], "cpus": isolated, "pids": [4800]}]
    found = [f for f in run(root, isolating(topology, isolated), leases=leases).findings
             if f.code == "isolated_cpus_misused"]
    assert [f.severity for f in found] == ["warning"]  # only the stacking remains


def test_device_irqs_on_isolated_cpus_are_a_host_finding(h800):
    root, topology = h800  # the fixture host delivers every IRQ to CPU 0
    report = run(root, isolating(topology, [0, 32]))
    finding = only(report, "isolated_cpus_misused")
    assert finding in report.host_findings and finding.pid is None
    assert "/sys/devices/system/cpu/isolated" in finding.files_read


def test_without_pids_doctor_checks_every_process_holding_a_gpu(h800):
    root, topology = h800
    write_process(root, well_placed_rank(topology, 4100, 0))
    write_process(root, replace(well_placed_rank(topology, 4900, 1), pid=4900, gpus=()))
    report = run(root, topology)
    assert [p.job.process.pid for p in report.processes] == [4100]
    assert report.processes[0].job.gpu_source == "fd"


def test_a_pid_that_does_not_exist_is_a_clear_error(h800):
    root, topology = h800
    with pytest.raises(DoctorInputError, match="--pid 999999: no such process"):
        run(root, topology, pids=[999999])


def test_gpus_come_from_cuda_visible_devices_when_no_handle_is_open(h800):
    root, topology = h800
    write_process(root, replace(far_socket_rank(topology, 5000, 2), gpus=()))
    report = run(root, topology, pids=[5000])
    assert report.processes[0].job.gpu_source == "env" and report.processes[0].job.gpus == (2,)
    assert "gpu_remote_cpu" in codes(report)


def test_secrets_in_the_environment_never_reach_the_report(h800):
    root, topology = h800
    write_process(root, well_placed_rank(topology, 4100, 0))
    from topod.doctor import report_to_json
    doc = report_to_json(run(root, topology))
    assert "AWS_SECRET_ACCESS_KEY" not in str(doc) and doc["processes"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert format_cpulist(well_placed_rank(topology, 4100, 0).cpus_allowed) == doc["processes"][0]["cores"]
