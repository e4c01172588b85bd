"""Discovery speed, on every real host of the vendored corpus (tests/data/hosts) and the
h800 fixture: whole-process `topoctl topo --json` vs `lstopo --input DIR --whole-io --of
xml` (ratio per host; topoctl is the console script beside this interpreter, as users
run it; the largest host also answered by a daemon; beside them the same
interpreter importing json and nothing else, `python -c 'import json'`, the floor of any
Python tool that prints JSON), and in-process rediscovery, full and with the daemon's
rescan memo (nothing changed), beside lstopo's whole-process time. One line per host,
then the worst ratios.

    python bench/discovery.py [--baseline DIR]

--baseline DIR: a directory holding an older `topod` package (for example
`mkdir /tmp/base && git archive HEAD topod | tar -x -C /tmp/base`); its in-process
rediscovery is measured in the same run, alternating with this tree's, and the ratio is
printed beside it (this is a shared machine: only figures from one run compare)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "data" / "hosts"  # vendored: a fresh clone has it
RUNS = 9
REDISCOVERIES = 50
ROUNDS = 3  # alternating rounds of this tree and the baseline

# Run in a fresh interpreter with PYTHONPATH set to the tree under test.
_REDISCOVER = """
import statistics, sys, time
from topod.discover import discover
from topod.host import HostRoot
try:
    from topod.discover.memo import DiscoveryMemo
except ImportError:  # a baseline tree from before the memo
    DiscoveryMemo = None
host = HostRoot(sys.argv[1])
def median(memo):
    discover(host, live_nvml=False, **memo)
    times = []
    for _ in range(int(sys.argv[2])):
        started = time.perf_counter()
        discover(host, live_nvml=False, **memo)
        times.append(time.perf_counter() - started)
    return statistics.median(times)
print(median({}), median({"memo": DiscoveryMemo()}) if DiscoveryMemo else "nan")
"""


def _median_seconds(command: list[str], env: dict | None = None) -> float:
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _rediscovery_seconds(code: Path, root: Path) -> tuple[float, float]:
    """(full pass, pass with a warm rescan memo) medians, in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _REDISCOVER, str(root), str(REDISCOVERIES)], cwd=code,
                          env=dict(os.environ, PYTHONPATH=str(code)), capture_output=True, text=True, check=True)
    full, memo = done.stdout.split()
    return float(full), float(memo)


# -- whole process: `topoctl topo --json` vs lstopo (topoctl's start-up; the CLI owner's part) --
WHOLE_RUNS = 21


def _interleaved_medians(commands: dict[str, tuple[list[str], dict]], cwd: str) -> dict[str, float]:
    """Median wall time of each command, run in turns (one of each per round), so that a
    busy moment on this shared machine hits all of them alike. `python -m` puts the working
    directory first on sys.path, ahead of PYTHONPATH: `cwd` must hold no topod package, or
    every command would run the code found there."""
    times: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(WHOLE_RUNS):
        for label, (command, env) in commands.items():
            started = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env,
                           cwd=cwd)
            times[label].append(time.perf_counter() - started)
    return {label: statistics.median(values) for label, values in times.items()}


def _start_daemon(root: Path, work: Path) -> tuple[subprocess.Popen, str]:
    socket_path = str(work / "topod.sock")
    config = work / "topod.toml"
    config.write_text('[irq]\nmode = "off"\n[probe]\nenabled = false\n')
    daemon = subprocess.Popen([sys.executable, "-m", "topod.service.main", "--root", str(root), "--socket",
                               socket_path, "--state-dir", str(work / "state"), "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    from topod.client import ApiError, Client

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and daemon.poll() is None:
        try:
            Client(socket_path, timeout=5).health()
            return daemon, socket_path
        except ApiError:
            time.sleep(0.05)
    daemon.kill()
    raise RuntimeError("topod did not start for the benchmark")


def whole_process_figures(name: str, root: Path, baseline: Path | None = None,
                          with_daemon: bool = True) -> dict[str, float]:
    """`topoctl topo --json` as a whole process (no daemon; answered by a daemon serving the
    root; an older tree's with --baseline) against `lstopo --input DIR --whole-io --of xml`."""
    daemon = None
    with tempfile.TemporaryDirectory() as work:
        # Compiled modules cached (outside the tree), as on an installed system, even where
        # PYTHONDONTWRITEBYTECODE is set: otherwise every run compiles every module.
        python_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        python_env["PYTHONPYCACHEPREFIX"] = str(Path(work) / "pycache")
        no_daemon = dict(python_env, PYTHONPATH=str(REPO), TOPOD_SOCKET=str(Path(work) / "no-daemon.sock"))
        from footprint import topoctl_command  # bench/footprint.py: the console script, as users run it

        command = [*topoctl_command(), "topo", "--root", str(root), "--json"]
        commands: dict[str, tuple[list[str], dict]] = {"topoctl": (command, no_daemon)}
        # The floor of any Python tool that prints JSON: the same interpreter, started the
        # same way, importing json (which brings re and enum) and doing nothing else.
        commands["python import json"] = ([sys.executable, "-c", "import json"], no_daemon)
        if baseline is not None:
            commands["baseline topoctl"] = (command, dict(no_daemon, PYTHONPATH=str(baseline)))
        lstopo = shutil.which("lstopo")
        if lstopo and "fixture" not in name:  # lstopo cannot read a built fixture tree
            commands["lstopo"] = ([lstopo, "--input", str(root), "--whole-io", "--of", "xml", "-"], dict(os.environ))
        if with_daemon:
            daemon, socket_path = _start_daemon(root, Path(work))
            commands["topoctl via daemon"] = (command + ["--socket", socket_path], dict(no_daemon))
        try:
            medians = _interleaved_medians(commands, cwd=work)
        finally:
            if daemon is not None:
                daemon.terminate()
                daemon.wait(timeout=10)
    return medians


def _hosts(work: Path) -> dict[str, Path]:
    roots = {}
    if CORPUS.is_dir():
        for archive in sorted(CORPUS.glob("*.tar.bz2")):
            with tarfile.open(archive) as tar:
                tar.extractall(work / archive.stem, filter="tar")
                roots[archive.name[:-8]] = work / archive.stem / tar.getnames()[0].split("/")[0]
    from topod.hostspec import build_host, load_builtin_spec

    roots["h800-8gpu (fixture)"] = build_host(load_builtin_spec("h800-8gpu"), work / "h800")
    return roots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=None, help="directory holding an older topod package")
    args = parser.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "topod" / "discover").is_dir():
        parser.error(f"--baseline {args.baseline}: no topod/discover package inside")
    sys.path.insert(0, str(REPO))  # this tree's topod, not an installed one

    if not shutil.which("lstopo"):
        print("lstopo not installed (Debian package hwloc): no baseline ratios")
    worst: dict[str, tuple[float, str]] = {}

    def keep_worst(key: str, value: float, name: str) -> None:
        if value == value and value > worst.get(key, (-1.0, ""))[0]:
            worst[key] = (value, name)

    with tempfile.TemporaryDirectory() as tmp:
        roots = _hosts(Path(tmp))
        largest = max((n for n in roots if "fixture" not in n),
                      key=lambda n: sum(1 for _ in roots[n].rglob("*")), default=None)
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians; "
              f"{WHOLE_RUNS} interleaved whole-process runs, {REDISCOVERIES} rediscoveries per host")
        for name, root in roots.items():
            whole = whole_process_figures(name, root, baseline=args.baseline, with_daemon=name == largest)
            current, theirs = [], []
            for _ in range(ROUNDS if args.baseline else 1):  # alternating: a busy moment hits both
                current.append(_rediscovery_seconds(REPO, root))
                if args.baseline:
                    theirs.append(_rediscovery_seconds(args.baseline, root))
            full = statistics.median(c[0] for c in current)
            memo = statistics.median(c[1] for c in current)
            lstopo = whole.get("lstopo")
            parts = [f"{name}: topoctl topo --json {whole['topoctl'] * 1e3:.1f} ms"]
            if lstopo:
                parts.append(f"lstopo {lstopo * 1e3:.1f} ms (ratio {whole['topoctl'] / lstopo:.2f})")
                keep_worst("topoctl/lstopo", whole["topoctl"] / lstopo, name)
            start = whole["python import json"]
            parts.append(f"python -c 'import json' {start * 1e3:.1f} ms"
                         + (f" ({start / lstopo:.2f}× lstopo)" if lstopo else ""))
            if lstopo:
                keep_worst("python import json/lstopo", start / lstopo, name)
            if "baseline topoctl" in whole:
                parts.append(f"baseline topoctl {whole['baseline topoctl'] * 1e3:.1f} ms "
                             f"(this/baseline {whole['topoctl'] / whole['baseline topoctl']:.2f})")
                keep_worst("topoctl this/baseline", whole["topoctl"] / whole["baseline topoctl"], name)
            if "topoctl via daemon" in whole and lstopo:
                parts.append(f"via daemon {whole['topoctl via daemon'] * 1e3:.1f} ms "
                             f"(ratio {whole['topoctl via daemon'] / lstopo:.2f})")
            parts.append(f"rediscovery {full * 1e3:.2f} ms, nothing changed (rescan memo) {memo * 1e3:.2f} ms")
            keep_worst("rediscovery ms", full * 1e3, name)
            keep_worst("rescan memo ms", memo * 1e3, name)
            if lstopo:
                parts.append(f"rediscovery/lstopo {full / lstopo:.2f}")
                keep_worst("rediscovery/lstopo", full / lstopo, name)
            if theirs:
                their_full = statistics.median(t[0] for t in theirs)
                their_memo = statistics.median(t[1] for t in theirs)
                parts.append(f"baseline rediscovery {their_full * 1e3:.2f} ms, rescan memo {their_memo * 1e3:.2f} ms "
                             f"(this/baseline {full / their_full:.2f}, memo {memo / their_memo:.2f})")
                keep_worst("memo this/baseline", memo / their_memo, name)
            print("; ".join(parts))
    print("worst: " + "; ".join(f"{key} {value:.2f} ({name})" for key, (value, name) in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
