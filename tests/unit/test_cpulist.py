import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topod.cpulist import MAX_CPUS, CpuListRangeError, format_cpulist, parse_cpulist, parse_cpumask


def test_cpulist_ranges_and_singles_expand_in_order():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_cpulist_accepts_stride_form_of_kernel_command_line():
    assert parse_cpulist("0-7:2") == [0, 2, 4, 6]


def test_empty_cpulist_is_no_cpus():
    assert parse_cpulist("\n") == []


def test_a_nul_after_the_newline_is_padding_as_some_kernels_print_it():
    # bytes as captured on a 128-core Arm host (hwloc's 128arm-2pa2n8cluster4co)
    assert parse_cpulist("0-31\n\x00") == list(range(32))
    assert parse_cpulist("\n\x00") == []
    assert parse_cpumask("00000000,ffffffff\n\x00") == list(range(32))


@pytest.mark.parametrize("garbage", ["0-3\x00,5", "\x001-2x"])
def test_a_nul_inside_a_list_is_still_garbage(garbage):
    with pytest.raises(ValueError):
        parse_cpulist(garbage)
    with pytest.raises(ValueError):
        parse_cpumask("ff\x00ff")


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


def _fast(seconds=0.5):
    import time

    started = time.perf_counter()
    return lambda: time.perf_counter() - started < seconds


def test_huge_cpulist_range_raises_instead_of_expanding():
    done_in_time = _fast()
    with pytest.raises(CpuListRangeError, match="4294967295"):
        parse_cpulist("0-4294967295")
    assert done_in_time()
    assert issubclass(CpuListRangeError, ValueError)  # callers that catch ValueError still do


def test_cpulist_limit_is_the_first_cpu_id_refused():
    assert parse_cpulist("0-7", limit=8) == list(range(8))
    with pytest.raises(CpuListRangeError, match="8-CPU limit"):
        parse_cpulist("0-8", limit=8)
    assert parse_cpulist(f"{MAX_CPUS - 1}") == [MAX_CPUS - 1]
    with pytest.raises(CpuListRangeError):
        parse_cpulist(f"{MAX_CPUS}")


def test_repeated_ranges_cannot_multiply_the_work():
    done_in_time = _fast()
    with pytest.raises(CpuListRangeError, match="more than"):
        parse_cpulist(",".join(["0-65535"] * 10_000))
    assert done_in_time()


def test_giant_cpumask_raises_quickly_and_leading_zero_words_are_fine():
    done_in_time = _fast()
    with pytest.raises(CpuListRangeError, match="beyond the 65536-CPU limit"):
        parse_cpumask(",".join(["ffffffff"] * 100_000))
    assert done_in_time()
    assert parse_cpumask(",".join(["00000000"] * 3000 + ["00000005"])) == [0, 2]
    with pytest.raises(CpuListRangeError):
        parse_cpumask("00000100", limit=8)
    assert parse_cpumask("000000ff", limit=8) == list(range(8))


@pytest.mark.parametrize("garbage", ["0x12", "+1", "1_0", "123456789"])
def test_cpumask_words_must_be_plain_hex_of_at_most_32_bits(garbage):
    with pytest.raises(ValueError):
        parse_cpumask(garbage)


@settings(derandomize=True, max_examples=200, deadline=None, database=None)
@given(st.sets(st.integers(min_value=0, max_value=4095), max_size=200))
def test_cpulist_and_cpumask_round_trip_any_set(cpus):
    assert parse_cpulist(format_cpulist(cpus), limit=4096) == sorted(cpus)
    value = sum(1 << cpu for cpu in cpus)
    words = [f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(128))]
    assert parse_cpumask(",".join(words), limit=4096) == sorted(cpus)


def test_a_mask_parsed_again_is_a_fresh_list_and_a_bad_one_is_refused_every_time():
    from topod.cpulist import parse_cpumask

    first = parse_cpumask("00000000,0000ff00")
    first.append(99)  # a caller's change never reaches the next caller
    assert parse_cpumask("00000000,0000ff00") == list(range(8, 16))
    for _ in range(2):
        with pytest.raises(ValueError, match="bad cpumask"):
            parse_cpumask("0000zz00")
        with pytest.raises(CpuListRangeError):
            parse_cpumask("ff", limit=4)
    # the limit is part of what is remembered: a mask fine under one limit is not under another
    assert parse_cpumask("0f", limit=4) == [0, 1, 2, 3]
    with pytest.raises(CpuListRangeError):
        parse_cpumask("0f", limit=3)
    # a long mask (over the cached length) parses the same way
    long_mask = ",".join(["00000000"] * 600 + ["00000001"])
    assert parse_cpumask(long_mask) == [0]


def test_the_remembered_masks_stay_bounded_whatever_the_host_sends():
    from topod import cpulist

    for cpu in range(2 * cpulist._CACHED_MASKS):  # more distinct masks than are kept
        assert cpulist.parse_cpumask(f"{1 << (cpu % 32):08x}" + ",00000000" * (cpu // 32)) == [cpu]
    assert len(cpulist._MASKS) <= cpulist._CACHED_MASKS
    cpulist._MASKS.clear()
    everything = ",".join(["ffffffff"] * 32)  # 1,024 CPUs: parsed, not kept
    assert len(cpulist.parse_cpumask(everything)) == 1024
    assert not cpulist._MASKS


def test_short_words_count_as_32_bits_each_wherever_they_are():
    # The kernel shortens only the first word (NR_CPUS not a multiple of 32); a short
    # word further on is still one 32-bit word, not digits run together with the next.
    assert parse_cpumask("f,0000000f") == [0, 1, 2, 3, 32, 33, 34, 35]
    assert parse_cpumask("f,f") == [0, 1, 2, 3, 32, 33, 34, 35]
    assert parse_cpumask("1,0,00000002") == [1, 64]
    with pytest.raises(ValueError):
        parse_cpumask("0x0000ff")  # int() would read it; a mask never holds it
    with pytest.raises(ValueError):
        parse_cpumask("0000_00ff")
