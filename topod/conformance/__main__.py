"""`make test-gpu` (python -m topod.conformance): on a GPU server, topod's GPUs, NUMA nodes,
links and NIC pairing against `nvidia-smi topo -m` and `rocm-smi --showtopo`.

Prints what it compared and one MISMATCH line per disagreement (exit 1), or one
`skipped: make test-gpu: <reason>` line (exit 0) on a host without GPUs. A vendor tool
that is absent is said so and its half is left unchecked. --nvidia-smi-file and
--rocm-smi-file take captured output instead (another host's, or a bug report's), with
--root naming that host's captured tree.

Then host-to-device copies near and far (topod.conformance.nearfar) through a probe
backend: `cuda` by default on this host's NVIDIA GPUs (needs cuda-python: `pip install
'topod[cuda]'`), any backend spec with --probe (`simulated:<table>` replays a link table),
`--probe none` to leave it out. A backend that cannot open is said so, not failed.
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
    parser.add_argument("--probe", default=None, metavar="BACKEND",
                        help="probe backend for the near/far copy check: cuda (default on this host's NVIDIA "
                             "GPUs), simulated:<table>, or none")
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
    mismatches += check_near_far(topology, probe_spec(args.probe, args.root, topology))
    return 1 if mismatches else 0


def probe_spec(given: str | None, root: str, topology) -> str | None:  # noqa: ANN001 - a Topology
    """The backend to copy with: the one given, else CUDA on this host's NVIDIA GPUs."""
    if given is not None:
        return None if given == "none" else given
    if root == "/" and any(gpu.vendor != "amd" for gpu in topology.gpus):
        return "cuda"
    return None


def check_near_far(topology, spec: str | None) -> list[object]:  # noqa: ANN001 - a Topology
    """Print each GPU's near and far copy rates; the mismatches."""
    from topod.conformance.nearfar import near_far
    from topod.probe.backend import ProbeUnavailable
    from topod.probe.registry import open_backend

    if spec is None:
        print("unchecked: near/far host-to-device copies: no probe backend for these GPUs here (--probe)")
        return []
    try:
        backend = open_backend(spec, topology)
    except (ProbeUnavailable, TopodError, OSError) as exc:
        print(f"unchecked: near/far host-to-device copies: {spec}: {exc}")
        return []
    try:
        checked, unchecked = near_far(topology, backend)
    finally:
        backend.close()
    for line in unchecked:
        print(f"unchecked: near/far {line}")
    for result in checked:
        print(result.line())
    found = [result for result in checked if result.mismatch]
    print(f"compared: near/far copies of {len(checked)} GPU(s) through {backend.name}: {len(found)} mismatch(es)")
    return found


if __name__ == "__main__":
    sys.exit(main())
