"""topology/block lines: one block per healthy multi-node NVLink domain, sized as Slurm's
block plugin reads them (see slurm_topology for the rules and why). Pure."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

from topod.errors import ConfigError
from topod.export.slurm_topology import (_UNSAFE, BLOCK_SIZES_KEY, MAX_NAME, HostEntry, Note, comment, header,
                                         version_text)

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
