"""Slurm `topology.conf` from several hosts' topology documents (`topoctl topo --json`,
or `GET /v1/topology`, which adds `cluster`). Pure: documents in, text and notes out.

Two modes, one per Slurm plugin (a file serves one):

- **block** (`TopologyPlugin=topology/block`, Slurm >= 23.11): one `BlockName=` per
  healthy multi-node NVLink domain (trays with the same cluster UUID and clique, fabric
  state `completed`, health ok where the capture has it). Slurm reads `BlockSizes`' first
  value as the base block: every listed block must hold at least that many nodes (24.05
  and 24.11 exit otherwise), and a job larger than one base block is placed as if no
  block could hold it. So the base is the common domain size (the size most domains
  have, the larger on a tie), not the smallest: a domain with fewer healthy trays is left
  out with a comment saying why. Trays still registering, degraded, split across cliques
  or clusters are left out by name. Left-out nodes stay ordinary nodes: Slurm's block
  plugin schedules a job without blocks when its candidate nodes hold no block node
  (give them a partition of their own). Slurm 23.11 knows `BlockLevels`, not
  `BlockSizes`, and needs blocks of one size: only domains of the base size are listed.
- **tree** (`topology/tree`, any Slurm with it; tested on 22.05): switches from the
  `[cluster]` labels `rack` and `leaf` (or `switch`). A leaf is scoped by its rack
  (`leaf-r1-l1`), hosts with only a rack label hang off their rack (through a
  `rack-R-nodes` switch when the rack also has leaves: Slurm refuses a switch with both
  nodes and switches), hosts without labels sit under `unlabelled` and are reported, and
  `top` joins the top-level switches. Every switch's labels are written in a comment.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topod.errors import ConfigError

# Slurm node and switch names: no whitespace, '=', ',' or brackets (hostlist syntax).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_NAME = 64  # topology.conf(5): a SwitchName is at most 64 characters
LEAF_KEYS = ("leaf", "switch")
RACK_KEYS = ("rack",)
MODES = ("auto", "block", "tree")
BLOCK_PLUGIN = (23, 11)  # topology/block first shipped in 23.11
BLOCK_SIZES_KEY = (24, 5)  # BlockSizes= replaced 23.11's BlockLevels= in 24.05
NEWEST = (25, 11)  # the newest format this exporter knows; later versions read it too
MAX_BLOCK_LEVEL = 15  # Slurm refuses a BlockSizes value above base * 2**15


@dataclass(frozen=True, slots=True)
class HostEntry:
    name: str
    cluster_uuid: str | None
    cliques: tuple[int, ...]
    labels: Mapping[str, str]
    fabric_problem: str | None = None  # why this tray's NVLink domain cannot be trusted


@dataclass(frozen=True, slots=True)
class Note:
    """A host left out of what it would belong to, and why (a warning for the operator)."""

    code: str  # slurm_block_left_out | slurm_host_unlabelled
    host: str
    reason: str


@dataclass(frozen=True, slots=True)
class TopologyConf:
    text: str
    mode: str  # block | tree
    slurm_version: tuple[int, int]
    block_sizes: tuple[int, ...] = ()
    notes: tuple[Note, ...] = ()


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
    uuid, cliques, problem = None, (), None
    if isinstance(domain, Mapping) and isinstance(domain.get("cluster_uuid"), str):
        uuid = domain["cluster_uuid"]
        raw = domain.get("clique_ids") or []
        if not isinstance(raw, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in raw):
            raise ConfigError(f"{where}: nvlink_domain.clique_ids must be a list of integers")
        cliques = tuple(sorted(set(raw)))
        problem = _fabric_problem(domain, cliques, document.get("gpus"))
    labels = document.get("cluster") or {}
    if not isinstance(labels, Mapping):
        raise ConfigError(f"{where}: 'cluster' must be an object of labels")
    return HostEntry(hostname, uuid, cliques, {str(k): str(v) for k, v in labels.items()}, problem)


def _fabric_problem(domain: Mapping[str, object], cliques: tuple[int, ...], gpus: object) -> str | None:
    """Why a tray cannot join its domain's block, or None when it can."""
    if not cliques:
        return "no NVLink clique id"
    if len(cliques) > 1:
        return f"GPUs split across cliques {','.join(map(str, cliques))}"
    others = domain.get("other_cluster_uuids") or []
    if isinstance(others, list) and others:
        return f"GPUs in {len(others) + 1} NVLink clusters ({domain['cluster_uuid']}, {', '.join(map(str, others))})"
    state = domain.get("state", "completed")
    if state != "completed":
        return f"fabric registration {state}"
    if not isinstance(gpus, list):
        return None  # a minimal document: the domain's summary is all there is
    for gpu in gpus:
        fabric = gpu.get("fabric") if isinstance(gpu, Mapping) else None
        index = gpu.get("index", "?") if isinstance(gpu, Mapping) else "?"
        if not isinstance(fabric, Mapping) or fabric.get("cluster_uuid") is None:
            return f"GPU {index} has not joined the NVLink domain"
        health = fabric.get("health")
        if health not in (None, "ok"):
            return f"fabric health {health} on GPU {index}"
    return None


# ---- options --------------------------------------------------------------------------

def parse_slurm_version(text: str) -> tuple[int, int]:
    """'23.11', '24.05.3' -> (23, 11); ValueError saying the form."""
    match = re.fullmatch(r"(\d{2})\.(\d{1,2})(?:\.\d+)*", text.strip())
    if not match or not 1 <= int(match.group(2)) <= 12:
        raise ValueError(f"{text!r} is not a Slurm release (YY.MM, e.g. 22.05, 23.11, 24.11)")
    return int(match.group(1)), int(match.group(2))


def parse_block_sizes(text: str) -> tuple[int, ...]:
    """'4' or '4,8,16' -> (4, 8, 16): the rules Slurm's block plugin exits on, checked here."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r}: expected node counts separated by commas, e.g. 4 or 4,8") from None
    if any(size <= 0 for size in sizes):
        raise ValueError(f"{text!r}: block sizes must be positive node counts")
    base = sizes[0]
    for size in sizes[1:]:
        ratio = size // base
        if size <= base or size % base or ratio & (ratio - 1) or ratio > 1 << MAX_BLOCK_LEVEL:
            raise ValueError(f"{text!r}: each size after the first must be the first ({base}) times a power "
                             f"of two (2..{1 << MAX_BLOCK_LEVEL}), in increasing order; {size} is not")
    if list(sizes) != sorted(set(sizes)):
        raise ValueError(f"{text!r}: sizes must increase")
    return sizes


def version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]:02d}"


# ---- the file -------------------------------------------------------------------------

def build_topology_conf(hosts: Sequence[HostEntry], *, mode: str = "auto",
                        slurm_version: tuple[int, int] | None = None,
                        block_sizes: tuple[int, ...] | None = None) -> TopologyConf:
    """The topology.conf for these hosts; ConfigError when no file Slurm accepts exists."""
    names = [h.name for h in hosts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"host name(s) given more than once: {', '.join(duplicates)}")
    if not hosts:
        raise ConfigError("no hosts: give one or more topology JSON files")
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    version = slurm_version or NEWEST
    if mode == "auto":
        mode = "block" if any(h.cluster_uuid for h in hosts) else "tree"
    if mode == "tree":
        if block_sizes:
            raise ConfigError("--block-sizes is for block mode; a tree has no block sizes")
        return _tree(hosts, version)
    if version < BLOCK_PLUGIN:
        raise ConfigError(f"Slurm {version_text(version)} has no topology/block plugin (it came in 23.11): "
                          "write a tree from the [cluster] labels with --mode tree")
    text, sizes, notes = render_blocks(hosts, version, block_sizes)
    return TopologyConf(text, "block", version, sizes, notes)


def render_topology_conf(hosts: Sequence[HostEntry], **options: object) -> str:
    return build_topology_conf(hosts, **options).text  # type: ignore[arg-type]


def comment(text: str) -> str:
    """A '# ' line; control characters from a document are escaped, never a new line."""
    return "# " + "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def header(mode: str, version: tuple[int, int]) -> list[str]:
    if mode == "tree":
        fits = "any Slurm with topology/tree"
    elif version < BLOCK_SIZES_KEY:
        fits = "Slurm 23.11 (BlockLevels=, blocks of one size)"
    else:
        fits = "Slurm 24.05 or later (BlockSizes=)"
    return ["# Slurm topology.conf written by topoctl export slurm-topology",
            f"# TopologyPlugin=topology/{mode}; for {fits}"]


# ---- block ----------------------------------------------------------------------------

Domain = tuple[str, int]  # (cluster UUID, clique id)


def base_block_size(sizes: Sequence[int]) -> int | None:
    """The size most multi-node domains have (the larger on a tie); None without any."""
    counts = Counter(size for size in sizes if size > 1)
    if not counts:
        return None
    return max(counts, key=lambda size: (counts[size], size))


def render_blocks(hosts: Sequence[HostEntry], version: tuple[int, int],
                  block_sizes: tuple[int, ...] | None) -> tuple[str, tuple[int, ...], tuple[Note, ...]]:
    domains: dict[Domain, list[str]] = {}
    notes: list[Note] = []
    plain: list[str] = []
    for host in hosts:
        if not host.cluster_uuid:
            plain.append(host.name)
        elif host.fabric_problem:
            notes.append(Note("slurm_block_left_out", host.name, host.fabric_problem))
        else:
            domains.setdefault((host.cluster_uuid, host.cliques[0]), []).append(host.name)
    sizes = {domain: len(members) for domain, members in domains.items()}
    base = block_sizes[0] if block_sizes else base_block_size(list(sizes.values()))
    if base is None:
        raise ConfigError("no healthy multi-node NVLink domain (two or more trays with the same cluster UUID "
                          "and clique, fabric registration completed): nothing to write as blocks; "
                          f"{_left_out_summary(notes, plain)}use --mode tree for a tree from the [cluster] labels")
    equal_only = version < BLOCK_SIZES_KEY
    listed = sorted(d for d, n in sizes.items() if (n == base if equal_only else n >= base))
    for domain in sorted(set(sizes) - set(listed)):
        why = _why_not_listed(sizes[domain], base, version, equal_only)
        notes.extend(Note("slurm_block_left_out", name, why) for name in sorted(domains[domain]))
    if not listed:
        found = ", ".join(str(n) for n in sorted(set(sizes.values()), reverse=True))
        need = f"exactly {base}" if equal_only else f"{base} or more"
        raise ConfigError(f"no NVLink domain has {need} healthy trays (domain sizes: {found}); "
                          "give --block-sizes a size a domain has")
    names = _block_names(listed)
    lines = header("block", version)
    lines.append(f"# one block per healthy multi-node NVLink domain; base block: {base} nodes")
    for domain in listed:
        count = sizes[domain]
        lines.append(comment(f"cluster {domain[0]} clique {domain[1]}: {count} trays"))
        if count > base:
            lines.append(comment(f"more than the base {base}: a job of {base + 1}-{count} nodes may be spread "
                                 f"over several blocks (--block-sizes {count} keeps it in this one)"))
        lines.append(f"BlockName={names[domain]} Nodes={','.join(sorted(domains[domain]))}")
    chosen = block_sizes or (base,)
    if equal_only:
        # 23.11: BlockLevels= are powers of two of the (equal) block size; 0 = single blocks only.
        levels = [(size // base).bit_length() - 1 for size in chosen]
        lines.append(f"BlockLevels={','.join(map(str, levels))}")
    else:
        lines.append(f"BlockSizes={','.join(map(str, chosen))}")
    for note in notes:
        lines.append(comment(f"left out: {note.host}: {note.reason}"))
    if plain:
        lines.append(comment(f"not in any NVLink domain (ordinary nodes, no block): {','.join(sorted(plain))}"))
    if notes or plain:
        lines.append("# nodes outside blocks still run jobs whose partition holds no block node")
    return "\n".join(lines) + "\n", tuple(chosen), tuple(notes)


def _why_not_listed(count: int, base: int, version: tuple[int, int], equal_only: bool) -> str:
    trays = f"{count} healthy tray{'s' if count != 1 else ''}"
    if equal_only:
        return (f"its NVLink domain has {trays}, not the block size {base}: Slurm {version_text(version)} "
                "needs blocks of one size")
    if count == 1:
        return "the only healthy tray of its NVLink domain (no multi-node block)"
    return (f"its NVLink domain has {trays}, fewer than the base block size {base} (a smaller "
            "block makes Slurm 24.05 and 24.11 exit)")


def _left_out_summary(notes: Sequence[Note], plain: Sequence[str]) -> str:
    parts = [f"{n.host}: {n.reason}" for n in notes[:5]]
    if len(notes) > 5:
        parts.append(f"{len(notes) - 5} more")
    if plain:
        parts.append(f"{len(plain)} host(s) without an NVLink domain")
    return f"({'; '.join(parts)}); " if parts else ""


def _block_names(domains: Sequence[Domain]) -> dict[Domain, str]:
    """nvl-<first 8 characters of the cluster UUID>-<clique>; the whole UUID where two
    clusters share those 8, a hash where a UUID needs changing characters."""
    short = Counter(uuid[:8] for uuid in {uuid for uuid, _ in domains})
    names = {}
    for uuid, clique in domains:
        tag = uuid[:8] if short[uuid[:8]] == 1 else uuid
        name = f"nvl-{tag}-{clique}"
        if _UNSAFE.search(name) or len(name) > MAX_NAME:
            name = f"nvl-{hashlib.sha1(uuid.encode()).hexdigest()[:12]}-{clique}"
        names[(uuid, clique)] = name
    if len(set(names.values())) != len(names):
        raise ConfigError("two NVLink domains would share a block name; check the cluster UUIDs")
    return names


# ---- tree -----------------------------------------------------------------------------

def _label(host: HostEntry, keys: tuple[str, ...]) -> str | None:
    return next((host.labels[k] for k in keys if k in host.labels), None)


def _tree(hosts: Sequence[HostEntry], version: tuple[int, int]) -> TopologyConf:
    # A switch is known by its labels: ("rack", r), ("leaf", r or None, l),
    # ("nodes", r) for rack-only hosts of a rack with leaves, ("unlabelled",).
    members: dict[tuple[str | None, ...], list[str]] = {}
    racks_with_leaves = {_label(h, RACK_KEYS) for h in hosts if _label(h, LEAF_KEYS) is not None}
    notes = []
    for host in hosts:
        leaf, rack = _label(host, LEAF_KEYS), _label(host, RACK_KEYS)
        if leaf is not None:
            key: tuple[str | None, ...] = ("leaf", rack, leaf)
        elif rack is not None:
            key = ("nodes", rack) if rack in racks_with_leaves else ("rack", rack)
        else:
            key = ("unlabelled",)
            notes.append(Note("slurm_host_unlabelled", host.name,
                              "no rack or leaf label ([cluster] in topod.toml): put under switch 'unlabelled'"))
        members.setdefault(key, []).append(host.name)
    children: dict[tuple[str | None, ...], list[tuple[str | None, ...]]] = {}
    for key in members:
        if key[0] in ("leaf", "nodes") and key[1] is not None:
            children.setdefault(("rack", key[1]), []).append(key)
    names = _switch_names(list(members) + [k for k in children if k not in members])
    lines = header("tree", version) + ["# switch names: rack-RACK, leaf-RACK-LEAF (leaf-LEAF without a rack), "
                                       "rack-RACK-nodes (hosts with only a rack label); labels in each comment"]
    for key in sorted(members, key=lambda k: names[k]):
        lines.append(comment(_describe(key)))
        lines.append(f"SwitchName={names[key]} Nodes={','.join(sorted(members[key]))}")
    for key in sorted(children, key=lambda k: names[k]):
        lines.append(comment(_describe(key)))
        lines.append(f"SwitchName={names[key]} Switches={','.join(sorted(names[c] for c in children[key]))}")
    below = {child for kids in children.values() for child in kids}
    tops = sorted(names[k] for k in set(members) | set(children) if k not in below)
    if len(tops) > 1:
        lines.append("# every top-level switch (no label says how they connect)")
        lines.append(f"SwitchName=top Switches={','.join(tops)}")
    return TopologyConf("\n".join(lines) + "\n", "tree", version, (), tuple(notes))


def _describe(key: tuple[str | None, ...]) -> str:
    if key[0] == "leaf":
        return f"leaf={key[2]}" + (f" rack={key[1]}" if key[1] is not None else " (no rack label)")
    if key[0] == "nodes":
        return f"rack={key[1]}, hosts without a leaf label"
    if key[0] == "rack":
        return f"rack={key[1]}"
    return "hosts without rack or leaf labels"


def _switch_names(keys: list[tuple[str | None, ...]]) -> dict[tuple[str | None, ...], str]:
    """Readable names (rack-r1, leaf-r1-l1); where labels would need changing characters,
    two keys would share a name, or a name passes 64 characters, a short hash of the
    labels keeps it unique (the comment above each switch gives the labels exactly)."""
    plain: dict[tuple[str | None, ...], str] = {}
    for key in keys:
        if key[0] == "leaf":
            parts = ["leaf"] + [p for p in key[1:] if p is not None]
        elif key[0] == "nodes":
            parts = ["rack", key[1], "nodes"]
        elif key[0] == "rack":
            parts = ["rack", key[1]]
        else:
            parts = ["unlabelled"]
        plain[key] = "-".join(str(p) for p in parts)
    counts = Counter(plain.values())
    names = {}
    for key, name in plain.items():
        if counts[name] > 1 or _UNSAFE.search(name) or len(name) > MAX_NAME:
            digest = hashlib.sha1(repr(key).encode()).hexdigest()[:8]
            name = _UNSAFE.sub("_", name)[:MAX_NAME - 9] + "-" + digest
        names[key] = name
    if len(set(names.values())) != len(names) or "top" in names.values():
        raise ConfigError("switch names collide even with a hash of their labels; rename a rack or leaf label")
    return names
