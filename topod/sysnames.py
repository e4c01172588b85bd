"""The names sysfs and its files use (cpuN, nodeN, hugepages-2048kB, PCI addresses and
host bridges, NVML bus ids, host names, hex words), matched with string methods.

Why not regular expressions: compiling the dozen that discovery used took ~0.8 ms of
every `topoctl` start, 6 % of the interpreter's own. These are also stricter
than those patterns were, on purpose: digits are ASCII only (`\\d` took any script's
digits, so a hostile tree's `cpu١` aliased cpu1) and a trailing newline is refused (`$`
let one through).
"""

from __future__ import annotations

DIGITS = frozenset("0123456789")
HEX = frozenset("0123456789abcdefABCDEF")
LOWER_HEX = frozenset("0123456789abcdef")
_HOST_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_HOST_REST = _HOST_FIRST | frozenset("._-")
# int() refuses a string of more than 4,300 digits (ValueError): a name that long is
# garbage, not a number, and is refused before int() sees it.
MAX_NUMBER_DIGITS = 4000
MAX_HOSTNAME = 253


def is_hex(text: str, shortest: int = 1, longest: int | None = None, *, lower: bool = False) -> bool:
    """Hex digits only, between shortest and longest of them (lower case only if lower)."""
    return (shortest <= len(text) and (longest is None or len(text) <= longest)
            and (LOWER_HEX if lower else HEX).issuperset(text))


def numbered(name: str, prefix: str, suffix: str = "", max_digits: int = MAX_NUMBER_DIGITS) -> int | None:
    """The number in `prefix` + decimal digits + `suffix` ('cpu12' -> 12); None otherwise."""
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return None
    digits = name[len(prefix): len(name) - len(suffix)]
    if not digits or len(digits) > max_digits or not DIGITS.issuperset(digits):
        return None
    return int(digits)


def is_pci_address(text: str, *, longest_domain: int | None = None, lower: bool = False) -> bool:
    """'0000:17:00.0': a domain of 4 or more hex digits (at most longest_domain), bus and
    device of 2, function 0-7."""
    domain, _, rest = text.partition(":")
    bus, _, slot = rest.partition(":")
    return is_hex(domain, 4, longest_domain, lower=lower) and _is_bus_slot(bus, slot, lower)


def _is_bus_slot(bus: str, slot: str, lower: bool) -> bool:
    """'18' and '00.0': a bus and a device of 2 hex digits, a function 0-7."""
    device, dot, function = slot.partition(".")
    return (dot == "." and len(function) == 1 and function in "01234567" and len(bus) == 2 and len(device) == 2
            and is_hex(bus + device, lower=lower))


def is_host_bridge(name: str) -> bool:
    """'pci0000:17': a PCI host bridge's directory in sys/devices."""
    if not name.startswith("pci"):
        return False
    domain, colon, bus = name[3:].partition(":")
    return colon == ":" and len(bus) == 2 and is_hex(domain, 4) and is_hex(bus)


def split_bus_id(text: str) -> tuple[str | None, str] | None:
    """NVML's lower-case '00000000:18:00.0' -> ('00000000', '18:00.0'); the domain (1-8 hex
    digits) may be left out: (None, '18:00.0'). None for anything else."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        return None
    domain = parts[0] if len(parts) == 3 else None
    if domain is not None and not is_hex(domain, 1, 8, lower=True):
        return None
    bus, slot = parts[-2], parts[-1]
    if not _is_bus_slot(bus, slot, lower=True):
        return None
    return domain, f"{bus}:{slot}"


def is_hostname(name: str) -> bool:
    """RFC 1123 letters: a letter or digit, then letters, digits, '.', '_' or '-'; 253 at most."""
    return 0 < len(name) <= MAX_HOSTNAME and name[0] in _HOST_FIRST and _HOST_REST.issuperset(name)
