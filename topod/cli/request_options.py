"""A lease request's options, as `topoctl allocate` and `topoctl run` both take them: the
fields of POST /v1/leases's body (topod.cli.lease_cmd builds the body from them).

Its own module so that the request's options are written once for the two commands, and
`topoctl topo`, which takes none of them, does not import it (nor topod.cli.option_values):
topod.cli.commands imports it when the allocate or run parser is made.
"""

from __future__ import annotations

import argparse

from topod.cli.option_values import cpus_per_gpu, gpu_names, seconds


def _cpu_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of CPUs, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=None,
                   help="number of GPUs (required unless --cpus is given; left out with --cpus: 0, a lease "
                        "without GPUs)")
    p.add_argument("--cpus", type=_cpu_count, default=None, metavar="N",
                   help="a lease without GPUs: N logical CPUs, rounded up to whole cores, from one NUMA node "
                        "(--level any: the nearest nodes too)")
    p.add_argument("--near", default=None, metavar="DEV",
                   help="with --cpus: take the CPUs near this device (nvme1, mlx5_0, eth0, a PCI address) or "
                        "node (node:1); default: the node with the most free CPUs")
    p.add_argument("--level", choices=("best", "good", "any"), default=None,
                   help="topology level to reach (default: the daemon's, good)")
    p.add_argument("--priority", type=int, default=None, help="higher is served first and may preempt")
    p.add_argument("--cpus-per-gpu", type=cpus_per_gpu, default=None,
                   help="CPUs leased beside each GPU: a number or 'auto' (default: the daemon's [alloc] "
                        "cpus_per_gpu, auto = each GPU's fair share of its node's whole cores)")
    p.add_argument("--must-include", type=gpu_names, default=None, metavar="GPUS",
                   help="comma-separated GPU indices, PCI addresses or UUIDs")
    p.add_argument("--min-memory-mib", type=int, default=None, help="only GPUs with at least this memory")
    p.add_argument("--nics-per-gpu", type=int, default=None, metavar="N",
                   help="RDMA NIC ports each GPU must get, nearest first (default: the nearest one where there "
                        "is one; 0: none)")
    p.add_argument("--model", default=None, help="GPU model substring")
    p.add_argument("--preemptible", action="store_true", help="a higher-priority request may preempt this lease")
    p.add_argument("--ttl", type=seconds, default=None, metavar="SECONDS", help="lease ends after this many seconds")
    p.add_argument("--wait", type=seconds, default=0.0, metavar="SECONDS",
                   help="queue up to this many seconds (0 = fail fast)")
    p.add_argument("--job", default=None, help="free-form job label")
