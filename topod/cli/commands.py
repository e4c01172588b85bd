"""topoctl's parser, built from a light table: argparse only, no handler imported.

Each command names its handler as "module:function"; topoctl imports that module only
when the command runs. When topoctl parses a command line (`build_parser(argv)`) only
the chosen command's parser is made (each one made is ~40 us, ~1 ms for all);
an error at the top level, whose usage lists every command, is then told by the whole
parser (`WholeParserNeeded`). `build_parser()` builds all of them (help, completion
scripts, man pages).

The value types of options (topod.cli.option_values) and a lease request's options
(topod.cli.request_options) are imported by the commands that take them, when their
parser is made.

Global options (`--socket`, `--json`, `--root`) are accepted before or after the command:
the top-level parser holds their defaults, and each subcommand adds them again with
SUPPRESS defaults so that a value given after the command wins and an absent one does
not overwrite a value given before it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

SUPPRESS = argparse.SUPPRESS


class Formatter(argparse.HelpFormatter):
    """argparse's formatter, sized without importing shutil (and with it zlib, bz2, lzma:
    ~3 ms): argparse builds a formatter for every add_argument call."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            import os

            try:
                columns = int(os.environ.get("COLUMNS", "0")) or os.get_terminal_size(2).columns
            except (OSError, ValueError):
                columns = 80
            width = max(columns, 40) - 2
        super().__init__(prog, indent_increment, max_help_position, width)


SOCKET_HELP = "daemon socket (default $TOPOD_SOCKET, else /run/topod/topod.sock)"
ROOT_HELP = ("host root to read (a captured tree); default: the root the daemon on --socket serves, "
             "else /")
EXIT_STATUS = (
    (0, "success"),
    (1, "error (the message says what to fix)"),
    (2, "usage error: unknown option, bad value"),
    (3, "not found: unknown lease or GPU (topoctl doctor: findings reported)"),
    (75, "temporary failure (EX_TEMPFAIL): no free capacity now, queue full, daemon unavailable; retry later "
         "(a request the host can never satisfy is 1)"),
    (141, "standard output closed early (a reader such as head(1) stopped reading; nothing is said)"),
)


class Command:
    """One topoctl command. (A plain class: dataclasses imports inspect, 7 ms at start-up.)"""

    __slots__ = ("name", "help", "populate", "host_side")

    def __init__(self, name: str, help: str, populate: Callable[[argparse.ArgumentParser], None],
                 host_side: bool = False) -> None:
        self.name = name
        self.help = help
        self.populate = populate
        self.host_side = host_side  # reads a host root (--root); uses a daemon's leases when it serves that root


def _globals(parser: argparse.ArgumentParser, root: bool) -> None:
    group = parser.add_argument_group("global options (also accepted before the command)")
    group.add_argument("--socket", default=SUPPRESS, metavar="PATH", help=SOCKET_HELP)
    group.add_argument("--json", action="store_true", default=SUPPRESS, help="machine-readable output")
    if root:
        group.add_argument("--root", default=SUPPRESS, metavar="DIR", help=ROOT_HELP)


def _handler(parser: argparse.ArgumentParser, target: str) -> None:
    parser.set_defaults(handler=target)


def _sub(parser: argparse.ArgumentParser, dest: str, metavar: str) -> argparse._SubParsersAction:
    # prog given: argparse would otherwise format the parent's usage to compute it
    return parser.add_subparsers(dest=dest, metavar=metavar, parser_class=argparse.ArgumentParser, prog=parser.prog)


def _leaf(sub: argparse._SubParsersAction, name: str, help_text: str, root: bool = True) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False,
                            formatter_class=Formatter)
    _globals(parser, root)
    return parser


# -- host-side commands ------------------------------------------------------------------
def _topo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "json", "dot", "svg", "png"), default=None,
                   help="output format (default text; --json means json); dot/svg/png draw the host with Graphviz")
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="file for --format svg/png/dot (default stdout)")
    p.add_argument("--matrix", "-m", action="store_true",
                   help="only the device matrix and its legends, as nvidia-smi topo -m prints them")
    _handler(p, "topod.cli.topo_cmd:run_topo")


def _snapshot(p: argparse.ArgumentParser) -> None:
    p.add_argument("output", help="OUT.tar.gz")
    _handler(p, "topod.cli.topo_cmd:run_snapshot")


def _irq_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, metavar="FILE",
                   help="topod.toml whose [irq] section to use (default: defaults)")
    p.add_argument("--leased-cpus", default="", metavar="CPUS",
                   help="CPU list to treat as leased, e.g. 4-7 (added to the daemon's leased CPUs)")
    p.add_argument("--banned-cpus", default=None, metavar="CPUS", help="override irq.banned_cpus")
    p.add_argument("--housekeeping-cpus", default=None, metavar="CPUS", help="override irq.housekeeping_cpus")
    p.add_argument("--irqbalance", choices=("yield", "ban"), default=None, help="override irq.irqbalance")


def _irq(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import seconds

    sub = _sub(p, "irq_command", "SUBCOMMAND")
    plan = _leaf(sub, "plan", "show where each device IRQ would go, and why (writes nothing)")
    _irq_common(plan)
    plan.add_argument("--interval", type=seconds, default=0.0, metavar="SECONDS",
                      help="sample counters this many seconds to plan with measured load (default: counts only)")
    _handler(plan, "topod.cli.irq_cmd:run_plan")
    apply = _leaf(sub, "apply", "run one balancing cycle")
    _irq_common(apply)
    apply.add_argument("--oneshot", action="store_true", help="one cycle, then exit (continuous balancing is topod's)")
    apply.add_argument("--dry-run", action="store_true", help="plan and report, write nothing")
    apply.add_argument("--force", action="store_true",
                       help="write even while a daemon balances this root continuously")
    apply.add_argument("--allow-in-container", action="store_true",
                       help="write even when the root is a container (its /proc/irq may be the host's); "
                            "without it a container's apply plans and writes nothing, exit 1")
    _handler(apply, "topod.cli.irq_cmd:run_apply")
    _handler(p, "topod.cli.topoctl:missing_subcommand")


def _links(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import positive_int

    p.add_argument("--backend", default="host-memory",
                   help="host-memory | cuda | simulated:<ground-truth table file>; default host-memory")
    p.add_argument("--rounds", type=positive_int, default=3, help="probe cycles to run; default 3")
    _handler(p, "topod.cli.links_cmd:run_links")


def _export(p: argparse.ArgumentParser) -> None:
    kinds = _sub(p, "export_kind", "KIND")
    nrt = _leaf(kinds, "nrt", "Kubernetes NodeResourceTopology (v1alpha2) as YAML")
    nrt.add_argument("--node-name", default=None, help="the Kubernetes Node name (default: the host's name)")
    nrt.add_argument("--policy", default="auto",
                     help="the kubelet's topology manager policy; default auto: from --kubelet-config, else none")
    nrt.add_argument("--scope", default="auto",
                     help="the kubelet's topology manager scope; default auto: from --kubelet-config, else container")
    nrt.add_argument("--kubelet-config", default="/var/lib/kubelet/config.yaml", metavar="PATH",
                     help="the kubelet's config file, under --root (default /var/lib/kubelet/config.yaml)")
    nrt.add_argument("--reserved-cpus", default="", metavar="CPUS",
                     help="CPUs the kubelet does not hand out, e.g. 0-1,32-33")
    nrt.add_argument("--leased-gpus", default="", metavar="GPUS",
                     help="GPU indices in use, e.g. 0,1 (added to the daemon's leased GPUs)")
    nrt.add_argument("--leased-cpus", default="", metavar="CPUS",
                     help="CPUs in use, e.g. 2-9 (added to the daemon's leased CPUs)")
    nrt.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help="a cluster label (rack=r12, leaf=l3); repeatable")
    nrt.add_argument("--nics", choices=("exclusive", "shared", "none"), default=None,
                     help="[alloc] nics: exclusive publishes RDMA NIC ports per zone (default: --config's, else shared)")
    nrt.add_argument("--config", default=None, metavar="FILE",
                     help="topod.toml whose [alloc] nics to use (default: the defaults)")
    _handler(nrt, "topod.cli.export_cmd:run_nrt")

    slurm = _leaf(kinds, "slurm-gres", "Slurm gres.conf lines for the GPUs")
    slurm.add_argument("--node-name", default=None, help="prefix each line with NodeName=NAME")
    slurm.add_argument("--device-dir", default="/dev", metavar="DIR",
                       help="where File= points: DIR/nvidiaN, N the device minor (default /dev)")
    _handler(slurm, "topod.cli.export_cmd:run_slurm")

    slurm_topo = _leaf(kinds, "slurm-topology", "a Slurm topology.conf from several hosts' topo --json files")
    slurm_topo.add_argument("files", nargs="+", metavar="FILE",
                            help="`topoctl topo --json` (or GET /v1/topology) output of each host; - for stdin")
    slurm_topo.add_argument("--name", action="append", default=None, metavar="NAME",
                            help="the Slurm node name of the n-th FILE (repeatable; default: its hostname)")
    slurm_topo.add_argument("--mode", default="auto", choices=("auto", "block", "tree"),
                            help="topology/block (NVLink domains) or topology/tree ([cluster] labels); "
                                 "default auto: block when a host is in an NVLink domain")
    slurm_topo.add_argument("--slurm-version", default=None, metavar="YY.MM",
                            help="the slurmctld release to write for (22.05, 23.11, 24.05...; default: newest)")
    slurm_topo.add_argument("--block-sizes", default=None, metavar="N[,N...]",
                            help="BlockSizes= (base block in nodes, then base times powers of two); "
                                 "default: the common NVLink domain size")
    _handler(slurm_topo, "topod.cli.export_cmd:run_slurm_topology")

    nccl = _leaf(kinds, "nccl", "an NCCL topology XML (NCCL_TOPO_FILE)")
    nccl.add_argument("--output", "-o", default=None, metavar="PATH",
                      help="write the file atomically here (NCCL's default: /var/run/nvidia-topologyd/"
                           "virtualTopology.xml); default: print it")
    nccl.add_argument("--gpus", default=None, help="only these GPU indices (a lease's file), e.g. 0-3")
    nccl.add_argument("--cpus", default=None, help="with --gpus: the lease's CPUs, narrowing each CPU affinity")
    nccl.add_argument("--lease", default=None, metavar="ID",
                      help="the file of this daemon lease (its GPUs and CPUs); exit 3 if there is none")
    _handler(nccl, "topod.cli.export_cmd:run_nccl")
    _handler(p, "topod.cli.topoctl:missing_subcommand")


def _doctor(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import seconds

    p.add_argument("--pid", type=int, action="append", default=None, metavar="PID",
                   help="process to check (repeatable); default: every process holding a GPU open")
    p.add_argument("--lease", action="append", default=None, metavar="ID",
                   help="check the processes of this lease (repeatable; needs lease data)")
    p.add_argument("--irq-interval", type=seconds, default=0.0, metavar="SECONDS",
                   help="sample /proc/interrupts twice this far apart to measure IRQ rates "
                        "(default 0: judge IRQs by affinity only)")
    p.add_argument("--leases-file", default=None, metavar="FILE",
                   help="JSON list of leases {id, owner, gpus, cpus, pids} (instead of asking the daemon)")
    p.add_argument("--irq-plan-file", default=None, metavar="FILE",
                   help="JSON object {irq: [cpus]}: where the IRQ plan puts each vector")
    p.add_argument("--verbose", "-v", action="store_true", help="list every file each finding read")
    _handler(p, "topod.cli.doctor_cmd:run_doctor")


# -- daemon commands ---------------------------------------------------------------------
def _allocate(p: argparse.ArgumentParser) -> None:
    from topod.cli.request_options import request_args

    request_args(p)
    p.add_argument("--owner-pid", type=int, default=None, metavar="PID", help="lease ends when this process exits")
    _handler(p, "topod.cli.lease_cmd:run_allocate")


def _release(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import lease_id

    p.add_argument("lease", type=lease_id, help="lease id")
    _handler(p, "topod.cli.lease_cmd:run_release")


def _revoke(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import lease_id

    p.add_argument("lease", type=lease_id, help="lease id")
    _handler(p, "topod.cli.lease_cmd:run_revoke")


def _scope(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import lease_id

    p.add_argument("lease", type=lease_id, help="lease id")
    p.add_argument("pid", type=int, help="a running process of yours (or a descendant); root: any")
    _handler(p, "topod.cli.lease_cmd:run_scope")


def _renew(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import lease_id, seconds

    p.add_argument("lease", type=lease_id, help="lease id")
    p.add_argument("--ttl", type=seconds, default=None, metavar="SECONDS", help="new ttl (default: the lease's)")
    _handler(p, "topod.cli.lease_cmd:run_renew")


def _leases(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import lease_id

    p.add_argument("lease", nargs="?", type=lease_id, default=None, metavar="ID",
                   help="show this lease whole: its GPUs, CPUs, NICs and environment (default: list every lease)")
    _handler(p, "topod.cli.lease_cmd:run_leases")


def _watch(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import count, event_name, seconds

    p.add_argument("--count", type=count, default=0, help="stop after this many (matching) events (0: no limit)")
    p.add_argument("--event", action="extend", nargs="+", type=event_name, default=None, metavar="NAME",
                   help="only these events, e.g. --event lease_granted lease_released (repeatable)")
    p.add_argument("--reconnect-timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="when the daemon goes away (restart, stop), keep trying to reconnect this long, "
                        "then exit 75; 0: exit 75 at once (default 300)")
    _handler(p, "topod.cli.watch_cmd:run_watch")


def _status(p: argparse.ArgumentParser) -> None:
    _handler(p, "topod.cli.lease_cmd:run_status")


def _reload(p: argparse.ArgumentParser) -> None:
    _handler(p, "topod.cli.lease_cmd:run_reload")


def _run(p: argparse.ArgumentParser) -> None:
    from topod.cli.request_options import request_args

    request_args(p)
    p.add_argument("--journal", action="store_true",
                   help="the command's stdout and stderr go to the journal, under its lease's scope "
                        "(journalctl -u topod-lease-ID.scope); an error where no journald runs")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    _handler(p, "topod.cli.lease_cmd:run_run")


def _bind(p: argparse.ArgumentParser) -> None:
    from topod.cli.option_values import count

    p.add_argument("--rank", type=count, default=None, help="local rank (default: $LOCAL_RANK, "
                   "$OMPI_COMM_WORLD_LOCAL_RANK, $SLURM_LOCALID)")
    p.add_argument("--gpu-memory", action="store_true", help="also bind memory to the GPU's own memory node")
    p.add_argument("--verbose", "-v", action="store_true", help="say the binding on stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    _handler(p, "topod.cli.bind_cmd:run_bind")


def _example_host(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", default=None, metavar="NAME", help="a built-in host (--list names them)")
    p.add_argument("directory", nargs="?", default=None, metavar="DIR",
                   help="where to write the tree: a new or empty directory")
    p.add_argument("--list", action="store_true", help="list the built-in hosts")
    p.add_argument("--demo-job", action="store_true",
                   help="also write an 8-rank job's processes (rank 3 on the far socket) for topoctl doctor")
    _handler(p, "topod.cli.example_host_cmd:run_example_host")


def _completion(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell to write a completion script for")
    _handler(p, "topod.cli.completion:run_completion")


COMMANDS: tuple[Command, ...] = (
    Command("topo", "show the host's topology (tree and nvidia-smi style device matrix)", _topo, host_side=True),
    Command("snapshot", "capture the host tree topod reads into a tar.gz", _snapshot, host_side=True),
    Command("irq", "plan or apply IRQ affinity", _irq, host_side=True),
    Command("links", "measure links and compare them with the topology model", _links, host_side=True),
    Command("export", "export the topology for Kubernetes, Slurm or NCCL", _export, host_side=True),
    Command("doctor", "check GPU processes' CPU, memory and IRQ placement", _doctor, host_side=True),
    Command("allocate", "lease GPUs with their near cores and memory", _allocate),
    Command("release", "end a lease", _release),
    Command("renew", "extend a lease's ttl", _renew),
    Command("revoke", "end anyone's lease (root): its job's scope is stopped too", _revoke),
    Command("scope", "put a running process in its lease's systemd scope (owner or root); the lease ends "
                     "with the scope", _scope),
    Command("leases", "list leases, or show one", _leases),
    Command("watch", "follow the daemon's events", _watch),
    Command("status", "the daemon's health", _status),
    Command("reload", "reload the daemon's config file and wait for its verdict (root; the unit's ExecReload=): "
                      "1 when the file is refused", _reload),
    Command("run", "allocate, run a command pinned to the lease, release", _run),
    Command("bind", "a rank's entry point in a lease: pin to its GPU's cores, bind memory, exec", _bind),
    Command("example-host", "write a built-in example host tree into a new directory, to try topod without the "
                            "hardware (--root DIR)", _example_host),
    Command("completion", "print a shell completion script (bash, zsh, fish)", _completion),
)
BY_NAME = {command.name: command for command in COMMANDS}
_VALUED_GLOBALS = ("--socket", "--root")


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command word of argv (skipping global options before it), or None."""
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if token in _VALUED_GLOBALS:
            skip = True
            continue
        if token == "--":
            return None
        if token.startswith("-"):
            continue
        return token
    return None


class WholeParserNeeded(Exception):
    """The one-command parser met an error at the top level: parse again with the whole
    parser (`build_parser(argv, every_command=True)`), whose usage names every command."""


class _OneCommandParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: ANN201 - never returns, as argparse's (typing costs ~2 ms to import)
        raise WholeParserNeeded(message)


def _asks_for_top_level_help(argv: Sequence[str], command: str) -> bool:
    """-h or --help before the command word: the top-level help, which lists every command."""
    before = argv[: list(argv).index(command)] if command in argv else argv
    return any(token in ("-h", "--help") for token in before)


def build_parser(argv: Sequence[str] | None = None, *, every_command: bool = False) -> argparse.ArgumentParser:
    """The whole parser (argv None), or one for argv: only its command's parser, when argv
    names one and asks for no top-level help (else every command's, only argv's populated)."""
    from topod import __version__

    wanted = None if argv is None else chosen_command(argv)
    populate_all = wanted not in BY_NAME
    one_command = not (populate_all or every_command or _asks_for_top_level_help(argv, wanted))
    parser = (_OneCommandParser if one_command else argparse.ArgumentParser)(
        prog="topoctl", allow_abbrev=False, formatter_class=Formatter,
        description="topod's command-line client: host views (topo, irq, export, doctor, links, snapshot) "
                    "and the daemon's leases (allocate, release, renew, leases, watch, status, run)",
        epilog="exit status: " + "; ".join(f"{code} {text}" for code, text in EXIT_STATUS))
    parser.add_argument("--version", action="version", version=f"topoctl {__version__}")
    parser.add_argument("--socket", default=None, metavar="PATH", help=SOCKET_HELP)
    parser.add_argument("--json", action="store_true", default=False, help="machine-readable output")
    parser.add_argument("--root", default=None, metavar="DIR", help=ROOT_HELP)
    subparsers = _sub(parser, "command_name", "COMMAND")
    for command in COMMANDS:
        if one_command and command.name != wanted:
            continue
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help, allow_abbrev=False,
                                    formatter_class=Formatter)
        if populate_all or command.name == wanted:
            _globals(sub, command.host_side)
            command.populate(sub)
    return parser
