"""doctor's /proc parsers and plain-value inputs: text in, values out, bad input named."""

import pytest

from topod.doctor import DoctorInputError, parse_irq_plan
from topod.doctor.findings import lease_from_dict
from topod.hostspec.doctor_scene import stat_line
from topod.doctor.procs import (
    gpu_minor_of_link,
    interrupt_rates,
    parse_environ,
    parse_interrupts,
    parse_numa_maps,
    parse_stat_processor,
    parse_status,
)


def test_stat_processor_survives_a_comm_with_spaces_and_parentheses():
    line = stat_line(77, "pt_main (x) y", 42)
    assert parse_stat_processor(line) == 42


def test_stat_from_an_old_kernel_without_processor_gives_none():
    assert parse_stat_processor("77 (python3) S 1 77 77 0 -1") is None
    assert parse_stat_processor("garbage") is None


def test_status_gives_allowed_cpus_and_tolerates_missing_fields():
    facts = parse_status("Name:\tpython3\nCpus_allowed_list:\t0-3,8\nMems_allowed_list:\t0\n")
    assert facts.cpus_allowed == (0, 1, 2, 3, 8) and facts.mems_allowed == (0,) and facts.name == "python3"
    assert parse_status("Name:\tx\n").cpus_allowed is None
    assert parse_status("Cpus_allowed_list:\tnot-a-list\n").cpus_allowed is None


def test_numa_maps_counts_pages_times_their_page_size():
    text = ("7f00 default anon=10 N0=6 N1=4 kernelpagesize_kB=4\n"
            "7e00 default file=/dev/hugepages/x huge N1=2 kernelpagesize_kB=2048\n"
            "7d00 default file=/lib/x.so\n")
    assert parse_numa_maps(text) == {0: 24, 1: 16 + 4096}


def test_environ_keeps_only_placement_variables():
    env = parse_environ("CUDA_VISIBLE_DEVICES=2,3\0NCCL_IB_HCA=mlx5_2\0AWS_SECRET_ACCESS_KEY=s3cr3t\0junk\0")
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3", "NCCL_IB_HCA": "mlx5_2"}


@pytest.mark.parametrize("target,minor", [("/dev/nvidia3", 3), ("/dev/nvidia12", 12), ("/dev/nvidiactl", None),
                                          ("/dev/nvidia-uvm", None), ("socket:[123]", None), (None, None)])
def test_only_gpu_device_files_count_as_gpu_handles(target, minor):
    assert gpu_minor_of_link(target) == minor


def test_interrupt_rates_between_two_snapshots():
    before = "      CPU0  CPU1\n 64:   100   0  PCI-MSIX mlx5_comp0\nNMI:  0  0  Non-maskable\n"
    after = "      CPU0  CPU1\n 64:   600  10  PCI-MSIX mlx5_comp0\nNMI:  5  5  Non-maskable\n"
    assert parse_interrupts(before) == {64: {0: 100, 1: 0}}
    assert interrupt_rates(before, after, 2.0) == {64: {0: 250.0, 1: 5.0}}


def test_interrupt_rates_need_a_positive_interval():
    with pytest.raises(ValueError, match="must be > 0"):
        interrupt_rates("", "", 0)


@pytest.mark.parametrize("bad,complaint", [
    ("not a dict", "must be an object"),
    ({"owner": "a"}, "'id'"),
    ({"id": "L1", "gpus": "0,1"}, "'gpus'"),
    ({"id": "L1", "cpus": [1, -2]}, "'cpus'"),
    ({"id": "L1", "pids": [True]}, "'pids'"),
])
def test_bad_lease_values_are_named(bad, complaint):
    with pytest.raises(DoctorInputError, match=complaint):
        lease_from_dict(bad)


def test_a_lease_dict_becomes_a_lease():
    lease = lease_from_dict({"id": "L1", "owner": "alice", "gpus": [1, 0], "cpus": [3, 2], "pids": [9]})
    assert (lease.id, lease.owner, lease.gpus, lease.cpus, lease.pids) == ("L1", "alice", (0, 1), (2, 3), (9,))


def test_irq_plan_takes_json_string_keys_and_rejects_garbage():
    assert parse_irq_plan({"64": [3, 2]}) == {64: (2, 3)}
    with pytest.raises(DoctorInputError, match="not an IRQ number"):
        parse_irq_plan({"x": [1]})
    with pytest.raises(DoctorInputError, match="list of CPU numbers"):
        parse_irq_plan({64: "1-3"})
