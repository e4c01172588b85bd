"""`make test-gpu` (python -m topod.conformance): on a GPU server, topod's GPUs, NUMA nodes,
links and NIC pairing against `nvidia-smi topo -m` and `rocm-smi --showtopo`.

Prints what it compared and one MISMATCH line per disagreement (exit 1), or one
`skipped: make test-gpu: <reason>` line (exit 0) on a host without GPUs. A vendor tool
that is absent is said so and its half is left unchecked. --nvidia-smi-file and
--rocm-smi-file take captured output instead (another host's, or a bug report's), with
--root naming that host's captured tree.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from topod.conformance.compare import compare_amd, compare_nvidia
from topod.conformance.smi_text import parse_nvidia_topo, parse_rocm_topo
from topod.discover import discover
from topod.errors import TopodError
from topod.host import HostRoot

TOOL_TIMEOUT_SECONDS = 60
TOOLS = {"nvidia": ("nvidia-smi", "topo", "-m"), "amd": ("rocm-smi", "--showtopo")}


def tool_output(vendor: str, given: str | None) -> tuple[str | None, str]:
    """(text, where it came from) of the vendor's tool; text None with the reason when absent."""
    if given:
        with open(given, encoding="utf-8", errors="replace") as handle:
            return handle.read(), given
    command = TOOLS[vendor]
    if shutil.which(command[0]) is None:
        return None, f"{command[0]} not found on PATH"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{' '.join(command)}: {exc}"
    if done.returncode != 0:
        return None, f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[:200]}"
    return done.stdout, " ".join(command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topod.conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/", help="host tree (default: this host)")
    parser.add_argument("--nvidia-smi-file", help="captured `nvidia-smi topo -m` output")
    parser.add_argument("--rocm-smi-file", help="captured `rocm-smi --showtopo` output")
    args = parser.parse_args(argv)
    try:
        topology = discover(HostRoot(args.root), live_nvml=args.root == "/")
    except TopodError as exc:
        print(f"skipped: make test-gpu: {exc}")
        return 0
    if not topology.gpus:
        print(f"skipped: make test-gpu: no GPU on this host (topod found none under {args.root})")
        return 0
    for gpu in topology.gpus:
        print(f"GPU{gpu.index} {gpu.address} {gpu.vendor or '?'} {gpu.model or gpu.name or '?'} "
              f"NUMA node {gpu.numa_node}")
    mismatches = []
    checks = (("nvidia", args.nvidia_smi_file, parse_nvidia_topo, compare_nvidia),
              ("amd", args.rocm_smi_file, parse_rocm_topo, compare_amd))
    for vendor, given, parse, compare in checks:
        if not any((gpu.vendor == "amd") == (vendor == "amd") for gpu in topology.gpus):
            continue
        text, source = tool_output(vendor, given)
        if text is None:
            print(f"unchecked: {vendor} GPUs: {source}")
            continue
        try:
            found = compare(topology, parse(text))
        except ValueError as exc:
            print(f"MISMATCH {source}: its output is not what topod expects: {exc}")
            mismatches.append(exc)
            continue
        for mismatch in found:
            print(mismatch.line())
        mismatches.extend(found)
        print(f"compared: {vendor} GPUs against {source}: {len(found)} mismatch(es)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
