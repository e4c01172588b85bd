import pytest

from topod.cpulist import format_cpulist, parse_cpulist, parse_cpumask


def test_cpulist_ranges_and_singles_expand_in_order():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_cpulist_accepts_stride_form_of_kernel_command_line():
    assert parse_cpulist("0-7:2") == [0, 2, 4, 6]


def test_empty_cpulist_is_no_cpus():
    assert parse_cpulist("\n") == []


@pytest.mark.parametrize("garbage", ["a-b", "3-1", "-1", "1,,x", "0-3:0"])
def test_garbage_cpulist_raises_value_error(garbage):
    with pytest.raises(ValueError):
        parse_cpulist(garbage)


def test_cpumask_words_are_most_significant_first():
    assert parse_cpumask("00000001,0000ff00") == list(range(8, 16)) + [32]


@pytest.mark.parametrize("garbage", ["", "zz", "00ff,,00"])
def test_garbage_cpumask_raises_value_error(garbage):
    with pytest.raises(ValueError):
        parse_cpumask(garbage)


def test_format_cpulist_compresses_runs_and_round_trips():
    cpus = [0, 1, 2, 3, 8, 10, 11, 63]
    assert format_cpulist(cpus) == "0-3,8,10-11,63"
    assert parse_cpulist(format_cpulist(cpus)) == cpus
