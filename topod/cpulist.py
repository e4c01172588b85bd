"""Parsers for the kernel's CPU list and mask formats (text in, values out)."""

from __future__ import annotations


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]. Raises ValueError on garbage.

    Also accepts the stride form '0-15:2' (used on kernel command lines)."""
    text = text.strip()
    if not text:
        return []
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        stride = 1
        if ":" in part:
            part, stride_text = part.split(":", 1)
            stride = int(stride_text.split("/")[0])
            if stride <= 0:
                raise ValueError(f"bad stride in cpulist {text!r}")
        if "-" in part:
            low_text, high_text = part.split("-", 1)
            low, high = int(low_text), int(high_text)
            if low < 0 or high < low:
                raise ValueError(f"bad range {part!r} in cpulist {text!r}")
            cpus.update(range(low, high + 1, stride))
        else:
            value = int(part)
            if value < 0:
                raise ValueError(f"negative cpu in cpulist {text!r}")
            cpus.add(value)
    return sorted(cpus)


def parse_cpumask(text: str) -> list[int]:
    """'00000000,0000ff00' -> [8..15]. Comma-separated 32-bit hex words, most
    significant first, as in local_cpus and smp_affinity. Raises ValueError."""
    words = text.strip().replace("\n", "").split(",")
    if not words or any(not word for word in words):
        raise ValueError(f"bad cpumask {text!r}")
    value = int("".join(words), 16)
    cpus = []
    bit = 0
    while value:
        if value & 1:
            cpus.append(bit)
        value >>= 1
        bit += 1
    return cpus


def format_cpulist(cpus: list[int] | set[int] | tuple[int, ...]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8' (the form /proc/irq/N/smp_affinity_list takes)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    index = 0
    while index < len(ordered):
        start = ordered[index]
        end = start
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        ranges.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(ranges)
