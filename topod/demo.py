"""`make demo`: topod on the embedded demo host (the seed's 8x H800 server), no root needed."""

from __future__ import annotations

import sys
import tempfile

from topod.cli.topoctl import main as topoctl
from topod.hostspec import build_host, load_builtin_spec

DEMO_HOST = "h800-8gpu"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="topod-demo-") as workdir:
        root = build_host(load_builtin_spec(DEMO_HOST), f"{workdir}/host")
        print(f"$ topoctl topo --root <demo host {DEMO_HOST}>")
        return topoctl(["topo", "--root", str(root)])


if __name__ == "__main__":
    sys.exit(main())
