"""Names of a PCI function's block and virtio children, which sit one level deeper than
net/infiniband/nvme/drm: virtio-net's interface is `<function>/virtioN/net/eth0`,
virtio-blk's disk `<function>/virtioN/block/vda` (as lstopo shows them), and a block
controller may have `<function>/block/NAME` directly."""

from __future__ import annotations

from topod.host import HostRoot
from topod.sysnames import numbered

VIRTIO_CHILD_DIRS = ("net", "block")


def is_virtio_dir(name: str) -> bool:
    return numbered(name, "virtio") is not None


def nested_child_names(host: HostRoot, base: str, entries: frozenset[str] | None) -> list[str]:
    """Names under `block/` and under each `virtioN/{net,block}/` of a function directory
    (`entries`: its listing, None when unknown and then listed here)."""
    listing = entries if entries is not None else host.listdir(base)
    names: list[str] = []
    if "block" in listing:
        names.extend(host.listdir(f"{base}/block"))
    # Only the few virtio entries are sorted: this runs for every function on every rescan.
    for entry in sorted(e for e in listing if e.startswith("virtio") and is_virtio_dir(e)):
        for sub in VIRTIO_CHILD_DIRS:
            names.extend(host.listdir(f"{base}/{entry}/{sub}"))
    return names
