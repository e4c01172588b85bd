"""The text of `nvidia-smi topo -m` and `rocm-smi --showtopo`, as values.

Both tools print for people, so the parsers tolerate what varies between versions
(trailing tabs, ANSI-free padding, extra legend lines) and raise ValueError, naming the
line, when the shape is not theirs at all.
"""

from __future__ import annotations

import re

from topod.record import field, record


@record
class SmiMatrix:
    """nvidia-smi's matrix: GPU and NIC labels, the level of every pair, each GPU's NUMA
    affinity, and the NIC legend (NIC0 -> mlx5_0)."""

    labels: tuple[str, ...]
    cells: dict[tuple[str, str], str]
    numa: dict[str, int | None]
    nic_names: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(label for label in self.labels if label.startswith("GPU"))


def _numa(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_nvidia_topo(text: str) -> SmiMatrix:
    lines = [line.rstrip("\n") for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if line.startswith("\t") and "GPU0" in line), None)
    if header_at is None:
        raise ValueError("nvidia-smi topo -m: no header line starting with a tab and naming GPU0")
    header = [h.strip() for h in lines[header_at].split("\t")[1:]]
    labels = tuple(h for h in header if re.fullmatch(r"(GPU|NIC)\d+", h))
    numa_column = header.index("NUMA Affinity") if "NUMA Affinity" in header else None
    cells: dict[tuple[str, str], str] = {}
    numa: dict[str, int | None] = {}
    for line in lines[header_at + 1:]:
        parts = [p.strip() for p in line.split("\t")]
        if not parts or parts[0] not in labels:
            if not line.strip() or line.startswith("Legend"):
                break
            continue
        row = parts[0]
        values = parts[1:]
        if len(values) < len(labels):
            raise ValueError(f"nvidia-smi topo -m: row {row} has {len(values)} cells for {len(labels)} columns")
        for column, value in zip(labels, values):
            cells[(row, column)] = "X" if value == "X" else value
        if row.startswith("GPU") and numa_column is not None and len(values) > numa_column:
            numa[row] = _numa(values[numa_column])
    nic_names = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.MULTILINE))
    return SmiMatrix(labels=labels, cells=cells, numa=numa, nic_names=nic_names)


@record
class RocmTopo:
    """rocm-smi --showtopo: per GPU pair its link type (XGMI, PCIE), weight and hops; per
    GPU its NUMA node."""

    count: int
    link_type: dict[tuple[int, int], str]
    weight: dict[tuple[int, int], int]
    hops: dict[tuple[int, int], int]
    numa: dict[int, int | None]


_SECTION = re.compile(r"^=+\s*(.*?)\s*=+$")


def _sections(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        head = _SECTION.match(line.strip())
        if head:
            current = found.setdefault(head.group(1).lower(), [])
            continue
        if current is not None and line.strip():
            current.append(line)
    return found


def _table(lines: list[str]) -> dict[tuple[int, int], str]:
    if not lines:
        return {}
    columns = [int(c[3:]) for c in lines[0].split() if re.fullmatch(r"GPU\d+", c)]
    out: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        parts = line.split()
        if not parts or not re.fullmatch(r"GPU\d+", parts[0]):
            continue
        if len(parts) - 1 != len(columns):
            raise ValueError(f"rocm-smi --showtopo: row {parts[0]} has {len(parts) - 1} cells for {len(columns)} GPUs")
        for column, value in zip(columns, parts[1:]):
            out[(int(parts[0][3:]), column)] = value
    return out


def parse_rocm_topo(text: str) -> RocmTopo:
    sections = _sections(text)
    kinds = next((lines for name, lines in sections.items() if name.startswith("link type")), None)
    if kinds is None:
        raise ValueError("rocm-smi --showtopo: no 'Link Type between two GPUs' section")
    link_type = {pair: value.upper() for pair, value in _table(kinds).items() if pair[0] != pair[1]}
    weights = next((lines for name, lines in sections.items() if name.startswith("weight")), [])
    hops = next((lines for name, lines in sections.items() if name.startswith("hops")), [])
    numa: dict[int, int | None] = {}
    for line in next((lines for name, lines in sections.items() if name.startswith("numa")), []):
        match = re.match(r"\s*GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa Node:\s*(-?\d+)", line)
        if match:
            node = int(match.group(2))
            numa[int(match.group(1))] = node if node >= 0 else None
    count = len({a for a, _ in _table(kinds)})
    return RocmTopo(count=count, link_type=link_type,
                    weight={p: int(v) for p, v in _table(weights).items() if v.isdigit() and p[0] != p[1]},
                    hops={p: int(v) for p, v in _table(hops).items() if v.isdigit() and p[0] != p[1]},
                    numa=numa)
