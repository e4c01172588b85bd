"""The /proc parsers and the rate arithmetic (text and values in, values out)."""

from __future__ import annotations

import pytest

from topod.irq.procfs import (
    IrqAffinity,
    Snapshot,
    measure_load,
    parse_affinity,
    parse_interrupts,
    parse_softirqs,
    parse_stat_irq_ticks,
)

INTERRUPTS = """\
           CPU0       CPU1       CPU2       CPU3
   0:         44          0          0          0   IO-APIC    2-edge      timer
   8:          0          0          0          0   IO-APIC    8-edge
  24:       1000          5          0          0  IR-PCI-MSIX-0000:14:00.0    0-edge      mlx5_comp0@pci:0000:14:00.0
  25:         10          0          0          0  IR-PCI-MSI 1048576-edge      nvme0q0
  26:          3          1          0          0  PCI-MSI-edge      eth0
  27:          7
 NMI:          0          0          0          0   Non-maskable interrupts
 LOC:     123456     234567     345678     456789   Local timer interrupts
 ERR:          0
 MIS:          0
"""


def test_interrupt_lines_give_counts_chip_hwirq_and_name():
    table = parse_interrupts(INTERRUPTS)
    assert table.cpus == (0, 1, 2, 3)
    line = table.lines[24]
    assert line.counts == (1000, 5, 0, 0)
    assert (line.chip, line.hwirq, line.name) == ("IR-PCI-MSIX-0000:14:00.0", "0-edge", "mlx5_comp0@pci:0000:14:00.0")
    assert table.lines[25].name == "nvme0q0" and table.lines[25].chip == "IR-PCI-MSI"


def test_per_cpu_only_and_err_mis_lines_are_not_irqs():
    assert set(parse_interrupts(INTERRUPTS).lines) == {0, 8, 24, 25, 26, 27}


def test_a_line_without_a_name_has_name_none():
    line = parse_interrupts(INTERRUPTS).lines[8]
    assert line.name is None and line.hwirq == "8-edge"


def test_old_format_without_hwirq_keeps_the_name():
    line = parse_interrupts(INTERRUPTS).lines[26]
    assert (line.chip, line.hwirq, line.name) == ("PCI-MSI-edge", None, "eth0")


def test_a_short_line_counts_missing_columns_as_zero():
    assert parse_interrupts(INTERRUPTS).lines[27].counts == (7, 0, 0, 0)


def test_sparse_cpu_columns_keep_their_cpu_numbers():
    table = parse_interrupts("      CPU0   CPU2   CPU5\n 30:  1  2  3  chip 0-edge q\n")
    assert table.cpus == (0, 2, 5) and table.lines[30].counts == (1, 2, 3)


@pytest.mark.parametrize("text", ["", "garbage\n", " 30: 1 2 3\n"])
def test_interrupts_without_a_cpu_header_are_rejected(text):
    with pytest.raises(ValueError, match="header names no CPU"):
        parse_interrupts(text)


def test_softirqs_parse_per_cpu_counts():
    text = "                    CPU0       CPU1\n          HI:   1   2\n      NET_RX:  10  20\n   bad: x y\n"
    assert parse_softirqs(text) == {"HI": {0: 1, 1: 2}, "NET_RX": {0: 10, 1: 20}}


def test_stat_gives_irq_plus_softirq_ticks_per_cpu():
    text = "cpu  1 2 3 4 5 6 7 8\ncpu0 10 0 10 100 0 3 4 0 0 0\ncpu1 1 2\nintr 5\n"
    assert parse_stat_irq_ticks(text) == {0: 7}


def test_affinity_tolerates_missing_and_garbage_files():
    assert parse_affinity("0-3\n", None, "1\n") == IrqAffinity((0, 1, 2, 3), None, 1)
    assert parse_affinity("zz", "", "x") == IrqAffinity(None, None, None)


def _snap(t: float, text: str, ticks: dict[int, int] | None = None) -> Snapshot:
    return Snapshot(t, parse_interrupts(text), {}, ticks or {}, {})


HEAD = "   CPU0   CPU1\n"


def test_rates_are_counter_deltas_per_second():
    load, why = measure_load(_snap(0, HEAD + " 5: 100 0 c 0-edge q\n"), _snap(10, HEAD + " 5: 600 50 c 0-edge q\n"))
    assert why is None and load.irq_rate == {5: 55.0} and load.irq_cpu_rate == {5: {0: 50.0, 1: 5.0}}
    assert load.unit == "interrupts/s" and load.weight == {5: 55.0}


def test_counters_going_backwards_mean_no_rate():
    load, why = measure_load(_snap(0, HEAD + " 5: 100 0\n"), _snap(10, HEAD + " 5: 10 0\n"))
    assert load is None and "went backwards" in why


def test_changed_cpu_columns_mean_no_rate():
    load, why = measure_load(_snap(0, HEAD + " 5: 1 0\n"), _snap(10, "   CPU0\n 5: 2\n"))
    assert load is None and "CPU columns changed" in why


def test_first_cycle_and_no_elapsed_time_mean_no_rate():
    snap = _snap(5, HEAD + " 5: 1 0\n")
    assert measure_load(None, snap)[0] is None
    assert "no time passed" in measure_load(snap, snap)[1]


def test_softirq_time_makes_an_expensive_irq_weigh_more():
    before = _snap(0, HEAD + " 5: 0 0\n 6: 0 0\n", {0: 0, 1: 0})
    after = _snap(1, HEAD + " 5: 100 0\n 6: 0 100\n", {0: 50, 1: 5})  # CPU 0 spent 10x the irq time
    load, _ = measure_load(before, after)
    assert load.unit == "cpu-share"
    assert load.weight[5] == pytest.approx(10 * load.weight[6])
    assert load.cpu_busy == {0: 0.5, 1: 0.05}


def test_a_parse_given_the_previous_reuses_unchanged_lines_and_parses_changed_ones():
    """Issue 26: an idle cycle converts only the IRQ lines whose text changed."""
    before = parse_interrupts(INTERRUPTS)
    changed = INTERRUPTS.replace("1000          5", "1200          9")
    assert changed != INTERRUPTS
    after = parse_interrupts(changed, before)
    assert after == parse_interrupts(changed)  # the same table as a parse from nothing
    assert after.lines[24].counts == (1200, 9, 0, 0) and after.lines[24] is not before.lines[24]
    assert all(after.lines[irq] is before.lines[irq] for irq in (0, 8, 25, 26, 27))
    # the next parse reuses what this one parsed, the changed line included
    assert parse_interrupts(changed, after).lines[24] is after.lines[24]


def test_a_parse_reuses_nothing_when_the_cpu_columns_changed():
    before = parse_interrupts(INTERRUPTS)
    fewer = INTERRUPTS.replace("CPU3", "")  # CPU 3 went offline: the same text, one column fewer
    after = parse_interrupts(fewer, before)
    assert after == parse_interrupts(fewer)
    assert after.cpus == (0, 1, 2) and after.lines[24].counts == (1000, 5, 0)
    assert all(after.lines[irq] is not before.lines[irq] for irq in after.lines)
