"""Parsers for the kernel's CPU list and mask formats (text in, values out).

Both are bounded: a list or mask naming a CPU at or beyond `limit` (default MAX_CPUS,
or the host's possible CPUs) raises CpuListRangeError instead of expanding, so
'0-4294967295' costs nothing."""

from __future__ import annotations

# More than any kernel's NR_CPUS (8,192 on the largest distribution configs).
MAX_CPUS = 1 << 16


# Padding around a list or mask, not content. Besides whitespace, a NUL after the newline:
# kernels that print the CPU bitmap files (node cpulist/cpumap, topology/*_cpus[_list])
# through their bitmap-to-buffer helpers as binary attributes end them with "\n\0", as
# captured on a 128-core Arm host (hwloc's 128arm-2pa2n8cluster4co). A NUL anywhere else
# is still garbage.
_PADDING = " \t\n\r\v\f\x00"


class CpuListRangeError(ValueError):
    """A CPU list or mask that names CPUs beyond the limit (or more CPUs than it)."""


def parse_cpulist(text: str, limit: int = MAX_CPUS) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]. Raises ValueError on garbage and
    CpuListRangeError (a ValueError) for a CPU id >= limit.

    Also accepts the stride form '0-15:2' (used on kernel command lines)."""
    text = text.strip(_PADDING)
    if not text:
        return []
    cpus: set[int] = set()
    expanded = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        stride = 1
        if ":" in part:
            part, stride_text = part.split(":", 1)
            stride = int(stride_text.split("/")[0])
            if stride <= 0:
                raise ValueError(f"bad stride in cpulist {_short(text)}")
        if "-" in part:
            low_text, high_text = part.split("-", 1)
            low, high = int(low_text), int(high_text)
            if low < 0 or high < low:
                raise ValueError(f"bad range {_short(part)} in cpulist {_short(text)}")
        else:
            low = high = int(part)
            if low < 0:
                raise ValueError(f"negative cpu in cpulist {_short(text)}")
        if high >= limit:
            raise CpuListRangeError(f"cpu {high} in cpulist {_short(text)} is beyond the {limit}-CPU limit")
        span = range(low, high + 1, stride)
        # A kernel list names each CPU once; repeated ranges cannot cost more than `limit`.
        expanded += len(span)
        if expanded > limit:
            raise CpuListRangeError(f"cpulist {_short(text)} names more than {limit} CPUs")
        cpus.update(span)
    return sorted(cpus)


def parse_cpumask(text: str, limit: int = MAX_CPUS) -> list[int]:
    """'00000000,0000ff00' -> [8..15]. Comma-separated 32-bit hex words, most
    significant first, as in local_cpus and smp_affinity. Raises ValueError, and
    CpuListRangeError for a set bit at or beyond limit (or more words than it needs)."""
    text = text.strip(_PADDING).replace("\n", "")
    key = (text, limit)
    known = _MASKS.get(key)
    if known is None:
        known = _cpumask(text, limit)
        if len(text) <= _CACHED_MASK_CHARS and len(known) <= _CACHED_MASK_CPUS:
            if len(_MASKS) >= _CACHED_MASKS:
                _MASKS.clear()
            _MASKS[key] = known
    return list(known)


# A rescan reads the same masks again (every NUMA node's cpumap, padded to the kernel's
# NR_CPUS, costs ~6 us to parse): the parse is pure, so an unchanged mask is parsed once.
# Bounded: only short masks naming few CPUs are kept, at most _CACHED_MASKS of them
# (a few MB at most, whatever the host), and a refused mask never is.
_CACHED_MASK_CHARS = 4096
_CACHED_MASK_CPUS = 512
_CACHED_MASKS = 256
_MASKS: dict[tuple[str, int], tuple[int, ...]] = {}


_NOT_MASK = str.maketrans("", "", "0123456789abcdefABCDEF,")


def _cpumask(text: str, limit: int) -> tuple[int, ...]:
    words = text.split(",")
    if text.translate(_NOT_MASK) or not all(0 < len(word) <= 8 for word in words):
        raise ValueError(f"bad cpumask {_short(text)}")
    if all(len(word) == 8 for word in words[1:]):
        # As the kernel prints them (only the first word may be short): one number. A
        # host with NR_CPUS=8192 pads each mask to 256 words, nearly all zero.
        value = int(text.replace(",", ""), 16)
    else:
        value = 0
        for word in words:
            value = (value << 32) | int(word, 16)
    if value.bit_length() > limit:
        raise CpuListRangeError(f"cpumask {_short(text)} sets CPU {value.bit_length() - 1}, "
                                f"beyond the {limit}-CPU limit")
    cpus: list[int] = []
    while value:
        low = value & -value
        cpus.append(low.bit_length() - 1)
        value ^= low
    return tuple(cpus)


def _short(text: str, width: int = 48) -> str:
    """repr of text, cut to width characters (error messages quote host input)."""
    return repr(text) if len(text) <= width else repr(text[:width]) + f"... ({len(text)} chars)"


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
