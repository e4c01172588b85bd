"""Slurm `topology.conf` from several hosts' topology documents (`topoctl topo --json`,
or `GET /v1/topology`, which adds `cluster`).

- Hosts whose GPUs are in a multi-node NVLink domain (`nvlink_domain`) are grouped per
  (cluster UUID, clique id): one `BlockName=` line per clique for the block plugin
  (`TopologyPlugin=topology/block`), then `BlockSizes=` with one value: the base block
  size, the node count of the smallest block (Slurm aggregates larger sizes from it).
- Without any clique, hosts are grouped by their `cluster` labels into a tree
  (`TopologyPlugin=topology/tree`): one leaf `SwitchName=` per leaf label (else rack
  label) with `Nodes=`, racks above leaves when both labels exist, and one top switch
  above everything.

Pure: documents in, text out. Node names are the documents' `hostname` (or the name
given per file).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topod.errors import ConfigError

# Slurm node and switch names: no whitespace, '=', ',' or brackets (hostlist syntax).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
LEAF_KEYS = ("leaf", "switch")
RACK_KEYS = ("rack",)


@dataclass(frozen=True, slots=True)
class HostEntry:
    name: str
    cluster_uuid: str | None
    cliques: tuple[int, ...]
    labels: Mapping[str, str]


def host_entry(document: Mapping[str, object], name: str | None = None, where: str = "document") -> HostEntry:
    """One host from its topology JSON; ConfigError saying what is missing."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where}: expected a topology JSON object (topoctl topo --json)")
    hostname = name or document.get("hostname")
    if not isinstance(hostname, str) or not hostname:
        raise ConfigError(f"{where}: no 'hostname' in the document; give the name with --name")
    if not _NAME.match(hostname):
        raise ConfigError(f"{where}: host name {hostname!r} is not a Slurm node name")
    domain = document.get("nvlink_domain")
    uuid, cliques = None, ()
    if isinstance(domain, Mapping) and isinstance(domain.get("cluster_uuid"), str):
        uuid = domain["cluster_uuid"]
        raw = domain.get("clique_ids") or []
        if not isinstance(raw, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in raw):
            raise ConfigError(f"{where}: nvlink_domain.clique_ids must be a list of integers")
        cliques = tuple(sorted(raw))
    labels = document.get("cluster") or {}
    if not isinstance(labels, Mapping):
        raise ConfigError(f"{where}: 'cluster' must be an object of labels")
    return HostEntry(hostname, uuid, cliques, {str(k): str(v) for k, v in labels.items()})


def render_topology_conf(hosts: Sequence[HostEntry]) -> str:
    names = [h.name for h in hosts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"host name(s) given more than once: {', '.join(duplicates)}")
    if not hosts:
        raise ConfigError("no hosts: give one or more topology JSON files")
    if any(h.cliques for h in hosts):
        return _blocks(hosts)
    return _tree(hosts)


def _blocks(hosts: Sequence[HostEntry]) -> str:
    groups: dict[tuple[str, int], list[str]] = {}
    loose = []
    for host in hosts:
        if not host.cliques:
            loose.append(host.name)
            continue
        # A host whose GPUs span cliques (a partly-registered tray) goes with its lowest.
        groups.setdefault((host.cluster_uuid or "", host.cliques[0]), []).append(host.name)
    lines = ["# Slurm topology.conf written by topoctl export slurm-topology",
             "# TopologyPlugin=topology/block; one block per multi-node NVLink clique"]
    for number, ((uuid, clique), members) in enumerate(sorted(groups.items())):
        lines.append(f"# cluster {uuid} clique {clique}")
        lines.append(f"BlockName=block{number} Nodes={','.join(sorted(members))}")
    lines.append(f"BlockSizes={min(len(m) for m in groups.values())}")
    if loose:
        lines.append(f"# not in any NVLink clique (not placed in a block): {','.join(sorted(loose))}")
    return "\n".join(lines) + "\n"


def _label(host: HostEntry, keys: tuple[str, ...]) -> str | None:
    return next((host.labels[k] for k in keys if k in host.labels), None)


def _tree(hosts: Sequence[HostEntry]) -> str:
    leaves: dict[str, list[str]] = {}
    rack_of_leaf: dict[str, str | None] = {}
    for host in hosts:
        leaf = _label(host, LEAF_KEYS)
        rack = _label(host, RACK_KEYS)
        key = _switch_name("leaf", leaf) if leaf else (_switch_name("rack", rack) if rack else "unlabelled")
        leaves.setdefault(key, []).append(host.name)
        rack_of_leaf.setdefault(key, _switch_name("rack", rack) if (leaf and rack) else None)
    lines = ["# Slurm topology.conf written by topoctl export slurm-topology",
             "# TopologyPlugin=topology/tree; no NVLink clique: switches from the [cluster] labels"]
    for leaf, members in sorted(leaves.items()):
        lines.append(f"SwitchName={leaf} Nodes={','.join(sorted(members))}")
    racks: dict[str, list[str]] = {}
    for leaf, rack in rack_of_leaf.items():
        if rack is not None and rack != leaf:
            racks.setdefault(rack, []).append(leaf)
    tops = sorted(set(leaves) - {leaf for members in racks.values() for leaf in members})
    for rack, members in sorted(racks.items()):
        lines.append(f"SwitchName={rack} Switches={','.join(sorted(members))}")
    tops = sorted(set(tops) | set(racks))
    if len(tops) > 1:
        lines.append(f"SwitchName=top Switches={','.join(tops)}")
    return "\n".join(lines) + "\n"


def _switch_name(kind: str, value: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value)
    return f"{kind}-{cleaned}"
