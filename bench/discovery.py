"""Discovery speed: whole-process `topoctl topo --json` vs `lstopo-no-graphics --whole-io
--of xml` on the largest real host, and in-process rediscovery. One line per figure."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "hosts"
RUNS = 9


def _median_seconds(command: list[str], env: dict | None = None) -> float:
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _hosts(work: Path) -> dict[str, Path]:
    roots = {}
    if CORPUS.is_dir():
        for archive in sorted(CORPUS.glob("*.tar.bz2")):
            with tarfile.open(archive) as tar:
                tar.extractall(work / archive.stem, filter="tar")
                roots[archive.name[:-8]] = work / archive.stem / tar.getnames()[0].split("/")[0]
    sys.path.insert(0, str(REPO))
    from topod.hostspec import build_host, load_builtin_spec

    roots["h800-8gpu (fixture)"] = build_host(load_builtin_spec("h800-8gpu"), work / "h800")
    return roots


def main() -> int:
    from topod.discover import discover
    from topod.host import HostRoot

    import os

    with tempfile.TemporaryDirectory() as tmp:
        roots = _hosts(Path(tmp))
        largest = max((n for n in roots if "fixture" not in n),
                      key=lambda n: sum(1 for _ in roots[n].rglob("*")), default=None)
        for name in [largest, "h800-8gpu (fixture)"]:
            if name is None:
                continue
            root = roots[name]
            topoctl = [sys.executable, "-m", "topod.cli.topoctl", "topo", "--root", str(root), "--json"]
            ours = _median_seconds(topoctl, env=dict(os.environ, PYTHONPATH=str(REPO)))
            print(f"{name}: topoctl topo --json whole process median {ours * 1000:.1f} ms")
            lstopo = shutil.which("lstopo-no-graphics")
            if lstopo and "fixture" not in name:
                theirs = _median_seconds([lstopo, "--whole-io", "--of", "xml", "-"],
                                         env=dict(os.environ, HWLOC_FSROOT=str(root), HWLOC_COMPONENTS="linux,-x86"))
                print(f"{name}: lstopo-no-graphics --whole-io --of xml median {theirs * 1000:.1f} ms; "
                      f"ratio topoctl/lstopo {ours / theirs:.2f} (goal <= 2)")
            elif not lstopo:
                print("lstopo-no-graphics not installed (Debian package hwloc): no baseline")
            host = HostRoot(root)
            discover(host, live_nvml=False)
            times = []
            for _ in range(50):
                started = time.perf_counter()
                discover(host, live_nvml=False)
                times.append(time.perf_counter() - started)
            print(f"{name}: in-process rediscovery median {statistics.median(times) * 1000:.2f} ms (goal <= 10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
