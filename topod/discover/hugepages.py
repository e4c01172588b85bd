"""Huge page pools per NUMA node: sys/devices/system/node/nodeN/hugepages/hugepages-<size>kB.

Each size directory holds nr_hugepages (the pool) and free_hugepages (not yet faulted in),
counted in pages. A kernel without hugetlbfs has no hugepages directory: no pools.
"""

from __future__ import annotations

from topod.discover.notes import Notes
from topod.host import HostRoot
from topod.model import HugePages
from topod.sysnames import numbered

MAX_PAGES = 1 << 40  # more pages than any machine has memory for: garbage


def parse_hugepage_size(name: str) -> int | None:
    """'hugepages-2048kB' -> 2048 (KiB); None for anything else."""
    size = numbered(name, "hugepages-", "kB", max_digits=9)
    return size or None


def parse_page_count(text: str) -> int:
    """'1024\\n' -> 1024; ValueError for anything but a non-negative count."""
    value = text.strip()
    if not value.isdigit() or int(value) > MAX_PAGES:
        raise ValueError(f"{value[:20]!r} is not a page count")
    return int(value)


def read_node_hugepages(host: HostRoot, node_dir: str, notes: Notes) -> dict[int, HugePages]:
    """Page size (KiB) -> pool of one node; sizes with an unreadable nr_hugepages are left
    out (warned), a missing or bad free_hugepages counts as none free (warned)."""
    pools: dict[int, HugePages] = {}
    base = f"{node_dir}/hugepages"
    for name in sorted(host.listdir(base)):
        size = parse_hugepage_size(name)
        if size is None:
            continue
        total = _count(host, f"{base}/{name}/nr_hugepages", notes)
        if total is None:
            continue
        free = _count(host, f"{base}/{name}/free_hugepages", notes)
        if free is None:
            free = 0
        elif free > total:
            notes.add("bad_value", f"{base}/{name}/free_hugepages", f"{free} free of {total} pages; counted as {total}")
            free = total
        pools[size] = HugePages(total=total, free=free)
    return dict(sorted(pools.items()))


def _count(host: HostRoot, rel: str, notes: Notes) -> int | None:
    text = host.read(rel)
    if text is None:
        notes.add("missing_file", rel, "no page count; this huge page size left out" if rel.endswith("nr_hugepages")
                  else "no free count; taken as 0 free")
        return None
    try:
        return parse_page_count(text)
    except ValueError as exc:
        notes.add("bad_value", rel, f"{exc}; ignored")
        return None
