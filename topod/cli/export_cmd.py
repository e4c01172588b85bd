"""`topoctl export nrt|slurm-gres|nccl`: the host model in other systems' formats.

These work without a daemon, from the host tree alone: no leases are known, so every
GPU and CPU counts as free unless --leased-gpus / --leased-cpus say otherwise.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from topod.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser("export", help="export the topology for Kubernetes, Slurm or NCCL")
    kinds = export.add_subparsers(dest="export_kind", metavar="KIND", required=True)

    nrt = kinds.add_parser("nrt", help="Kubernetes NodeResourceTopology (v1alpha2) as YAML")
    _common(nrt)
    nrt.add_argument("--node-name", default=None, help="the Kubernetes Node name (default: the host's name)")
    nrt.add_argument("--policy", default="none", help="the kubelet's --topology-manager-policy (default none)")
    nrt.add_argument("--scope", default="container", help="the kubelet's --topology-manager-scope")
    nrt.add_argument("--reserved-cpus", default="", help="CPUs the kubelet does not hand out, e.g. 0-1,32-33")
    nrt.add_argument("--leased-gpus", default="", help="GPU indices in use, e.g. 0,1")
    nrt.add_argument("--leased-cpus", default="", help="CPUs in use, e.g. 2-9")
    nrt.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help="a cluster label (rack=r12, leaf=l3); repeatable")
    nrt.set_defaults(handler=run_nrt)

    slurm = kinds.add_parser("slurm-gres", help="Slurm gres.conf lines for the GPUs")
    _common(slurm)
    slurm.add_argument("--node-name", default=None, help="prefix each line with NodeName=NAME")
    slurm.set_defaults(handler=run_slurm)

    nccl = kinds.add_parser("nccl", help="an NCCL topology XML (NCCL_TOPO_FILE)")
    _common(nccl)
    nccl.add_argument("--output", "-o", default=None,
                      help="write the file atomically here (NCCL's default: /var/run/nvidia-topologyd/"
                           "virtualTopology.xml); default: print it")
    nccl.add_argument("--gpus", default=None, help="only these GPU indices (a lease's file), e.g. 0-3")
    nccl.add_argument("--cpus", default=None, help="with --gpus: the lease's CPUs, narrowing each CPU affinity")
    nccl.set_defaults(handler=run_nccl)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", default="/", help="host root (a captured tree); default /")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _cpus(text: str | None, option: str) -> list[int]:
    from topod.cpulist import parse_cpulist

    if not text:
        return []
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc} (expected a list like 0-3,8)") from exc


def _host_and_topology(root: str):
    from topod.discover import discover
    from topod.host import HostRoot

    host = HostRoot(root)
    return host, discover(host, live_nvml=host.is_live)


def node_name_of(host, given: str | None) -> str:
    """--node-name, else the tree's hostname, else (live host only) this machine's name."""
    if given:
        return given
    name = host.read_line("proc/sys/kernel/hostname")
    if not name and host.is_live:
        name = socket.gethostname()
    if not name:
        raise ConfigError(f"--root {host.root}: no hostname in the tree; pass --node-name")
    return name


def run_nrt(args: argparse.Namespace) -> int:
    from topod.export.labels import parse_cluster_labels
    from topod.export.nrt import NrtSettings, build_nrt

    labels: dict[str, object] = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--label {item!r}: expected KEY=VALUE, e.g. rack=r12")
        labels[key] = value
    settings = NrtSettings(topology_manager_policy=args.policy, topology_manager_scope=args.scope)
    host, topology = _host_and_topology(args.root)
    obj = build_nrt(
        topology,
        node_name_of(host, args.node_name),
        leased_gpus=_cpus(args.leased_gpus, "--leased-gpus"),
        leased_cpus=_cpus(args.leased_cpus, "--leased-cpus"),
        reserved_cpus=_cpus(args.reserved_cpus, "--reserved-cpus"),
        labels=parse_cluster_labels(labels, section="--label"),
        settings=settings,
    )
    if args.json:
        json.dump(obj, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
    return 0


def run_slurm(args: argparse.Namespace) -> int:
    from topod.export.slurm import gres_lines, render_gres_conf

    _, topology = _host_and_topology(args.root)
    if args.json:
        lines = gres_lines(topology, node_name=args.node_name)
        rows = [{"file": line.file, "type": line.type, "cores": list(line.cores), "links": list(line.links),
                 "line": line.render()} for line in lines]
        json.dump({"gres": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_gres_conf(topology, node_name=args.node_name))
    return 0


def run_nccl(args: argparse.Namespace) -> int:
    from topod.export.nccl import build_nccl_xml, read_nccl_host_facts, render_nccl_xml, write_nccl_topology

    host, topology = _host_and_topology(args.root)
    gpus = _cpus(args.gpus, "--gpus") if args.gpus is not None else None
    cpus = _cpus(args.cpus, "--cpus") if args.cpus is not None else None
    if cpus is not None and gpus is None:
        raise ConfigError("--cpus narrows a lease's file; give --gpus too")
    facts = read_nccl_host_facts(host, topology)
    system = build_nccl_xml(topology, gpus=gpus, cpus=cpus, cpu_identity=facts.cpu_identity,
                            net_names=facts.net_names, subsystem_ids=facts.subsystem_ids, gdr=facts.gdr)
    text = render_nccl_xml(system)
    if args.output and args.output != "-":
        path = write_nccl_topology(text, args.output)
        if args.json:
            print(json.dumps({"path": str(path), "bytes": len(text), "gpus": _gpu_indices(topology, gpus)}))
        else:
            print(f"wrote {path} ({len(text)} bytes); use it with NCCL_TOPO_FILE={path}")
        return 0
    if args.json:
        print(json.dumps({"gpus": _gpu_indices(topology, gpus), "xml": text}))
    else:
        sys.stdout.write(text)
    return 0


def _gpu_indices(topology, gpus: list[int] | None) -> list[int]:
    return sorted(gpus) if gpus is not None else [gpu.index for gpu in topology.gpus]
