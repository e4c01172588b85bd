"""`topoctl export nrt|slurm-gres|nccl`: the host model in other systems' formats.

They read the host tree. With a daemon serving the same root, its leases count: leased
GPUs, CPUs and (with [alloc] nics = exclusive) NIC ports are not `available` in the NRT
object (added to --leased-gpus/--leased-cpus),
and `nccl --lease ID` writes that lease's file. Without one, every GPU and CPU counts as
free unless the options say otherwise. Arguments: topod.cli.commands.
"""

from __future__ import annotations

import argparse
import json
import sys

from topod.errors import ConfigError
from topod.jsonindent import dumps_indented


def _cpus(text: str | None, option: str) -> list[int]:
    from topod.cpulist import parse_cpulist

    if not text:
        return []
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc} (expected a list like 0-3,8)") from exc


def _view(args: argparse.Namespace):
    from topod.cli.daemon_view import find

    view = find(args)
    view.announce(args.json)
    return view


def _host_and_topology(root: str):
    from topod.discover import discover
    from topod.host import HostRoot

    host = HostRoot(root)
    return host, discover(host, live_nvml=host.is_live)


def node_name_of(host, given: str | None) -> str:
    """--node-name as given, else the tree's hostname, else (live host only) this machine's
    name; a host name lowercased, as the kubelet names its Node."""
    if given:
        return given
    name = host.read_line("proc/sys/kernel/hostname")
    if not name and host.is_live:
        import socket

        name = socket.gethostname()
    if not name:
        raise ConfigError(f"--root {host.root}: no hostname in the tree; pass --node-name")
    return name.lower()


def _warn(args: argparse.Namespace, warning) -> None:
    """A host warning on stderr: a 'topoctl: warning:' line, or with --json a JSON line."""
    if args.json:
        sys.stderr.write(json.dumps({"warning": warning.to_json()}) + "\n")
    else:
        sys.stderr.write(f"topoctl: warning: [{warning.code}] {warning.path}: {warning.reason}\n")


def run_nrt(args: argparse.Namespace) -> int:
    from topod.export.labels import parse_cluster_labels
    from topod.export.kubelet import resolve_topology_manager
    from topod.export.nrt import POLICIES, SCOPES, NrtSettings, build_nrt

    labels: dict[str, object] = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--label {item!r}: expected KEY=VALUE, e.g. rack=r12")
        labels[key] = value
    leased_gpus = _cpus(args.leased_gpus, "--leased-gpus")
    leased_cpus = _cpus(args.leased_cpus, "--leased-cpus")
    reserved_cpus = _cpus(args.reserved_cpus, "--reserved-cpus")
    for option, value, allowed in (("--policy", args.policy, POLICIES), ("--scope", args.scope, SCOPES)):
        if value != "auto" and value not in allowed:
            kind = "policy" if option == "--policy" else "scope"
            raise ConfigError(f"{option} {value!r}: topology_manager_{kind} must be auto or one of {', '.join(allowed)}")
    view = _view(args)
    host, topology = _host_and_topology(view.root)
    manager = resolve_topology_manager(host, args.kubelet_config, args.policy, args.scope, POLICIES, SCOPES)
    for warning in manager.warnings:
        _warn(args, warning)
    settings = NrtSettings(topology_manager_policy=manager.policy, topology_manager_scope=manager.scope,
                           topology_manager_source=manager.source)
    nic_mode = _nic_mode(args)
    if nic_mode != "exclusive" and not args.json and any(d.rdma_ports for d in topology.devices_of_kind("rdma")):
        print(f"topoctl: note: no RDMA NIC resources published: [alloc] nics is {nic_mode} "
              f"({'--nics' if args.nics else '--config' if args.config else 'the default'}); only exclusive NICs "
              "are a countable resource (--nics exclusive, or --config with the daemon's file)", file=sys.stderr)
    obj = build_nrt(
        topology,
        node_name_of(host, args.node_name),
        leased_gpus=sorted(set(leased_gpus) | view.leased_gpus()),
        leased_cpus=sorted(set(leased_cpus) | view.leased_cpus()),
        reserved_cpus=reserved_cpus,
        labels=parse_cluster_labels(labels, section="--label"),
        settings=settings,
        nic_mode=nic_mode,
        leased_nics=leased_nic_keys(view.leases()),
    )
    if args.json:
        sys.stdout.write(dumps_indented(obj) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
    return 0


def _nic_mode(args: argparse.Namespace) -> str:
    """--nics, else --config's [alloc] nics, else the default (shared)."""
    if args.nics:
        return args.nics
    from topod.config import load_config

    return str(load_config(args.config).section("alloc")["nics"]) if args.config else "shared"


def leased_nic_keys(leases: list[dict]) -> list[str]:
    """`<address>/<port>` of every NIC port the daemon's leases carry (placements[].nics[])."""
    keys = []
    for lease in leases:
        for placement in lease.get("placements") or ():
            for nic in (placement.get("nics") or ()) if isinstance(placement, dict) else ():
                if isinstance(nic, dict) and "address" in nic and "port" in nic:
                    keys.append(f"{nic['address']}/{nic['port']}")
    return keys


def run_slurm(args: argparse.Namespace) -> int:
    from topod.export.slurm import gres_lines, render_gres_conf

    _, topology = _host_and_topology(_view(args).root)
    for warning in topology.warnings:
        if warning.code in ("gpu_minor_unknown", "gpu_minor_mismatch", "gpu_minor_duplicate"):
            _warn(args, warning)
    if args.json:
        lines = gres_lines(topology, node_name=args.node_name, device_dir=args.device_dir)
        rows = [{"file": line.file, "index": line.index, "minor_known": line.minor_known, "type": line.type,
                 "cores": list(line.cores), "links": list(line.links), "line": line.render()} for line in lines]
        sys.stdout.write(dumps_indented({"gres": rows}) + "\n")
    else:
        sys.stdout.write(render_gres_conf(topology, node_name=args.node_name, device_dir=args.device_dir))
    return 0


def run_nccl(args: argparse.Namespace) -> int:
    from topod.export.nccl_host import host_nccl_xml, write_nccl_topology

    gpus = _cpus(args.gpus, "--gpus") if args.gpus is not None else None
    cpus = _cpus(args.cpus, "--cpus") if args.cpus is not None else None
    if cpus is not None and gpus is None:
        raise ConfigError("--cpus narrows a lease's file; give --gpus too")
    if args.lease is not None and (gpus is not None or cpus is not None):
        from topod.cli.exits import UsageError

        raise UsageError("--lease takes the lease's GPUs and CPUs: give it without --gpus/--cpus")
    view = _view(args)
    if args.lease is not None:
        lease = view.lease(args.lease)
        gpus, cpus = sorted(lease.get("gpus", [])), sorted(lease.get("cpus", [])) or None
    host, topology = _host_and_topology(view.root)
    written = host_nccl_xml(host, topology, gpus=gpus, cpus=cpus)
    for warning in written.warnings:
        _warn(args, warning)
    text = written.text
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


def run_slurm_topology(args: argparse.Namespace) -> int:
    """Several hosts' `topoctl topo --json` documents (files, or - for stdin) -> topology.conf;
    hosts left out of blocks (or unlabelled in a tree) are warnings on stderr."""
    from topod.cli.exits import UsageError
    from topod.export.slurm_topology import (build_topology_conf, host_entry, parse_block_sizes,
                                             parse_slurm_version, version_text)

    version = sizes = None
    try:
        if args.slurm_version is not None:
            version = parse_slurm_version(args.slurm_version)
    except ValueError as exc:
        raise UsageError(f"--slurm-version {exc}") from exc
    try:
        if args.block_sizes is not None:
            sizes = parse_block_sizes(args.block_sizes)
    except ValueError as exc:
        raise UsageError(f"--block-sizes {exc}") from exc
    if sizes and args.mode == "tree":
        raise UsageError("--block-sizes is for --mode block; a tree has no block sizes")
    names = list(args.name or [])
    if len(names) > len(args.files):
        raise ConfigError(f"--name given {len(names)} times for {len(args.files)} file(s)")
    hosts = []
    for position, path in enumerate(args.files):
        where = "stdin" if path == "-" else path
        try:
            text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        except OSError as exc:
            raise ConfigError(f"{where}: {exc.strerror or exc}") from exc
        try:
            document = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{where}: not JSON ({str(exc)[:80]}); give `topoctl topo --json` output") from exc
        given = names[position] if position < len(names) and names[position] else None
        hosts.append(host_entry(document, given, where))
    if args.mode == "block" and version is not None and version < (23, 11):
        raise UsageError(f"--mode block: Slurm {version_text(version)} has no topology/block plugin (it came in "
                         "23.11); use --mode tree")
    conf = build_topology_conf(hosts, mode=args.mode, slurm_version=version, block_sizes=sizes)
    for note in conf.notes:
        if args.json:
            sys.stderr.write(json.dumps({"warning": {"code": note.code, "host": note.host,
                                                     "reason": note.reason}}) + "\n")
        else:
            sys.stderr.write(f"topoctl: warning: [{note.code}] {note.host}: {note.reason}\n")
    if args.json:
        sys.stdout.write(dumps_indented({
            "topology_conf": conf.text, "hosts": [h.name for h in hosts], "mode": conf.mode,
            "slurm_version": version_text(conf.slurm_version), "block_sizes": list(conf.block_sizes),
            "left_out": [{"code": n.code, "host": n.host, "reason": n.reason} for n in conf.notes],
        }) + "\n")
    else:
        sys.stdout.write(conf.text)
    return 0
