"""topod's discovery against lstopo's on captured host trees: for every `*.tar.bz2` in the
given directories (hwloc's own regression suite, `tests/hwloc/linux` of open-mpi/hwloc, or
this repository's `tests/data/hosts`), lstopo's view (`lstopo --whole-system --whole-io
--of xml` with HWLOC_FSROOT=TREE) beside topod's (`topod.discover`, as the daemon and topoctl run it):

- NUMA nodes: each of lstopo's nodes, its online CPUs against topod's `local_cpus`;
- cores: lstopo's Core objects against topod's hyper-thread sibling sets;
- PCI: each function lstopo lists, its parent bridge and local CPUs.

One line per tree (OK, or what differs), then the totals. A report, not a verdict: where
the two disagree on purpose (docs/architecture.md, "Discovery rules") it says so in the
differences.

    python scripts/lstopo_compare.py DIR [DIR...]
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topod.discover import discover  # noqa: E402
from topod.errors import NotAHostTreeError  # noqa: E402
from topod.host import HostRoot  # noqa: E402


def cpuset(text: str | None) -> frozenset[int]:
    """hwloc's '0x00000004,,0x0': 32-bit words, highest first, a zero word maybe empty."""
    value = 0
    for word in (text or "0").split(","):
        value = (value << 32) | int(word or "0", 16)
    return frozenset(cpu for cpu in range(value.bit_length()) if value >> cpu & 1)


def lstopo_view(root: Path) -> tuple[dict[int, frozenset[int]], set[frozenset[int]], dict[str, tuple]]:
    xml = subprocess.run(["lstopo-no-graphics", "--whole-system", "--whole-io", "--of", "xml", "-"],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, HWLOC_FSROOT=str(root), HWLOC_THISSYSTEM="0",
                                  HWLOC_SHOW_ERRORS="none")).stdout
    return parse_lstopo_xml(xml)


def parse_lstopo_xml(xml: str) -> tuple[dict[int, frozenset[int]], set[frozenset[int]], dict[str, tuple]]:
    """(NUMA node -> CPUs, cores, PCI bus id -> (parent bridge's bus id, local CPUs))."""
    numa: dict[int, frozenset[int]] = {}
    cores: set[frozenset[int]] = set()
    pci: dict[str, tuple] = {}

    def walk(obj: ET.Element, cpus: frozenset[int], bridge: str | None) -> None:
        kind, busid = obj.get("type"), obj.get("pci_busid")
        own = cpuset(obj.get("cpuset")) if obj.get("cpuset") is not None else cpus
        if kind == "NUMANode":
            numa[int(obj.get("os_index"))] = own
        elif kind == "Core":
            cores.add(own)
        elif kind in ("PCIDev", "Bridge") and busid:
            pci[busid] = (bridge, own)
        for child in obj.findall("object"):
            walk(child, own, busid if kind == "Bridge" and busid else bridge)

    walk(ET.fromstring(xml).find("object"), frozenset(), None)
    return numa, cores, pci


def compare(root: Path, totals: collections.Counter) -> list[str]:
    numa, cores, pci = lstopo_view(root)
    topology = discover(HostRoot(root), live_nvml=False)
    online = frozenset(cpu.id for cpu in topology.cpus if cpu.online)
    ours = {node.id: frozenset(node.local_cpus) for node in topology.numa_nodes}
    differences = []
    for node, cpus in sorted(numa.items()):
        totals["numa nodes"] += 1
        if ours.get(node) == cpus & online:
            totals["numa nodes agreeing"] += 1
        else:
            differences.append(f"NUMA node {node}: lstopo {sorted(cpus & online)}, topod "
                               f"{sorted(ours[node]) if node in ours else 'no such node'}")
    if extra := sorted(set(ours) - set(numa)):
        differences.append(f"NUMA nodes only topod has: {extra}")
    theirs = {core & online for core in cores if core & online}
    siblings = {frozenset(cpu.siblings) for cpu in topology.cpus if cpu.online}
    totals["trees"] += 1
    if siblings == theirs:
        totals["trees whose cores agree"] += 1
    else:
        differences.append(f"cores: lstopo {len(theirs)}, topod {len(siblings)} (e.g. lstopo "
                           f"{[sorted(c) for c in sorted(theirs - siblings, key=min)[:2]]}, topod "
                           f"{[sorted(c) for c in sorted(siblings - theirs, key=min)[:2]]})")
    devices = {device.address: device for device in topology.pci_devices}
    for busid, (parent, cpus) in sorted(pci.items()):
        totals["PCI functions"] += 1
        device = devices.get(busid)
        if device is None:
            differences.append(f"PCI {busid}: not found by topod")
        elif device.parent != parent or frozenset(device.local_cpus) != cpus & online:
            differences.append(f"PCI {busid}: parent {device.parent} / lstopo {parent}, local CPUs "
                               f"{sorted(device.local_cpus)} / lstopo {sorted(cpus & online)}")
        else:
            totals["PCI functions agreeing"] += 1
    return differences


def tree_root(target: Path) -> Path:
    entries = list(target.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else target


def main(directories: list[str]) -> int:
    if not directories:
        print(__doc__, file=sys.stderr)
        return 2
    totals: collections.Counter = collections.Counter()
    with tempfile.TemporaryDirectory() as work:
        for archive in sorted(p for d in directories for p in Path(d).glob("*.tar.bz2")):
            name = archive.name.removesuffix(".tar.bz2")
            target = Path(work) / name
            target.mkdir()
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="fully_trusted")
            try:
                differences = compare(tree_root(target), totals)
            except NotAHostTreeError as exc:
                print(f"{name}: not a whole host tree ({exc})")
                continue
            except subprocess.CalledProcessError as exc:
                print(f"{name}: lstopo failed ({exc.stderr.strip()[:200]})")
                continue
            print(f"{name}: {'OK' if not differences else 'differs'}", *(f"    {d}" for d in differences), sep="\n")
    print("totals: " + ", ".join(f"{key} {value}" for key, value in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
