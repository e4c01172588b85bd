"""Packing (pure): which of the equal-cost GPU sets to take so the free GPUs stay together.

- phi(x): the mean, over x's groups (NUMA node, root complex, PCIe switch, NVLink island;
  groups of one GPU ignored), of the share of that group still free. The engine weighs it
  1e-7 (more for low-priority or short requests: topod.alloc.policy) so that it only
  breaks ties: among equal-cost sets, take GPUs from partly used groups.
- the look-ahead: of the sets tied at the minimum objective, the one after which the
  most requests of every size could be served at once at the host's best (disjoint
  host-minimum sets, hostview's census); then the one after which the most could be so
  served once any one running lease ends (summed over the leases: GPUs a lease holds
  free together); then the most host-minimum sets still wholly free.
- cheapest_one: the search's answer for one GPU with nothing but phi to weigh, by bit masks.

Every table here is built once per host view and kept in its cache (view.cache).
"""

from __future__ import annotations

from itertools import product
from math import comb

from topod.alloc.hostview import Census, HostView, best_set_census
from topod.alloc.search import SearchResult

# phi lists kept per view (by busy set): this many divided by the view's GPUs, oldest out.
PHI_MEMO_GPUS = 16_384
# phi values kept per GPU kind (see phi_of): 1,024 at most, ~0.1 MiB per kind (256 on a
# kind whose groups span 8 GPUs, all its busy patterns).
KIND_MEMO = 1_024
# look_ahead's scores kept per view (class mix left free, and with the lease shape).
SERVED_MEMO = 4_096
# The look-ahead counts disjoint host-minimum sets (servable) on hosts of at most this
# many class mixes (81 on pcie-8gpu, 256 on the cube mesh: every count, 2 ms, at
# prepare()); above it, the count of sets alone. On a 16-GPU host of eight classes of two
# (6,561 mixes) the counts take ~190 ms in all, up to 0.5 ms for one mix, and a decision
# needs one per tied set and lease: past the 1 ms goal there.
SERVABLE_MIXES = 1_024


def cheapest_one(view: HostView, busy: set[int], weight: float,
                  node_cap: dict[int, int] | None) -> SearchResult | None:
    """search.solve_one over every free GPU with the terms weight x phi, without the
    terms per GPU: GPUs of one kind (same groups) share phi, so per kind only its lowest
    free GPU on a node with room can win; of those the least weight x phi (the same
    floats solve_one compares), the lowest position on a tie, as solve_one picks."""
    taken = busy_bits(view, busy)
    _, sizes = group_index(view)
    kinds, _, masks, spans, known_of = group_kinds(view)
    kind_masks, node_masks = kind_positions(view)
    closed = taken
    if node_cap is not None:
        for v, mask in node_masks.items():
            if node_cap.get(v, 1) < 1:
                closed |= mask
    open_ = ~closed
    best, pick = float("inf"), -1
    for kind, mask in enumerate(kind_masks):
        room = mask & open_
        if not room:
            continue  # phi only for kinds with an open GPU (few, on a busy host)
        value = known_of[kind].get(taken & spans[kind])
        if value is None:
            value = phi_value(kinds[kind], sizes, masks, taken, known_of[kind], spans[kind])
        u = weight * value
        if u < best or (u == best and (room & -room).bit_length() - 1 < pick):
            best, pick = u, (room & -room).bit_length() - 1  # the kind's lowest open position
    if pick < 0:
        return None
    return SearchResult((pick,), best, True, 1)


def kind_positions(view: HostView) -> tuple[list[int], dict]:
    """Per GPU kind (group_kinds) its positions, and per NUMA node its positions, as bit
    masks; kept per view."""
    cached = view.cache.get("kind_positions")
    if cached is None:
        kinds, kind_of = group_kinds(view)[:2]
        kind_masks = [0] * len(kinds)
        node_masks: dict = {}
        for p, kind in enumerate(kind_of):
            kind_masks[kind] |= 1 << p
            node_masks[view.node[p]] = node_masks.get(view.node[p], 0) | 1 << p
        cached = view.cache["kind_positions"] = (kind_masks, node_masks)
    return cached


def free_per_twin(view: HostView, busy: set[int]) -> list[int]:
    free_in = [0] * (max(view.twin) + 1)
    for p in range(view.n):
        if p not in busy:
            free_in[view.twin[p]] += 1
    return free_in


def look_ahead(view: HostView, census: Census, busy: set[int], ties: list[SearchResult],
               leases: tuple[tuple[int, ...], ...] = ()) -> SearchResult:
    """Of equal-cost sets, the one that keeps the most requests servable at the host's
    best, by three measures in turn:
    1. disjoint host-minimum sets left free, summed over sizes (what requests that come
       next could get at once; a free path of two double links holds two best pairs
       but serves one pair request);
    2. the same once one running lease ends, summed over the leases (`leases`: per lease
       the twin classes of its GPUs, see lease_classes). Leases end independently and
       any of them may be next, and a lease's GPUs come back together: a single GPU put
       into the hole a big lease leaves in a node keeps that node from coming back
       whole, one put beside another small lease does not (on the cube mesh, the optimal
       policy's commonest difference from the census count alone);
    3. host-minimum sets still wholly free, counted once per way to pick them, so a
       whole free switch or node keeps many.
    1 and 2 only where weighs_servable (their cost: SERVABLE_MIXES); 3 alone elsewhere.
    `ties` comes lowest objective first, so phi decides among equals."""
    if len(ties) == 1:
        return ties[0]
    free_in = free_per_twin(view, busy)
    weighs = weighs_servable(view)
    best, chosen = None, ties[0]
    for result in ties:
        left = list(free_in)
        for p in result.members:
            left[view.twin[p]] -= 1
        score = _served_left(view, census, left, leases) if weighs else sets_left(view, census, left)
        if best is None or score > best:
            best, chosen = score, result
    return chosen


def _served_left(view: HostView, census: Census, left: list[int],
                 leases: tuple[tuple[int, ...], ...]) -> tuple[int, int, int]:
    """look_ahead's three measures for a class mix left free, kept per view with the lease shape."""
    memo = view.cache.setdefault("served_left", {})
    key = (tuple(left), leases)
    score = memo.get(key)
    if score is None:
        if len(memo) >= SERVED_MEMO:
            memo.clear()
        score = memo[key] = (servable(view, census, left), servable_after_one_end(view, census, left, leases),
                             sets_left(view, census, left))
    return score


def weighs_servable(view: HostView) -> bool:
    """Whether look_ahead counts disjoint sets (and so weighs the leases) on this host:
    a census, of at most SERVABLE_MIXES class mixes."""
    applies = view.cache.get("weighs_servable")
    if applies is None:
        mixes = 1
        for count in free_per_twin(view, set()):
            mixes *= count + 1
        applies = view.cache["weighs_servable"] = bool(best_set_census(view)) and mixes <= SERVABLE_MIXES
    return applies


def prepare_servable(view: HostView) -> None:
    """Every class mix's servable count, computed now (engine.prepare), so no decision
    pays for one."""
    if not weighs_servable(view):
        return
    census = best_set_census(view)
    for left in product(*(range(count + 1) for count in free_per_twin(view, set()))):
        servable(view, census, list(left))
    view.cache.pop("most_disjoint", None)  # what servable keeps covers every mix now


def lease_classes(view: HostView, leases) -> tuple[tuple[int, ...], ...]:  # noqa: ANN001 - GPU position sets
    """Per lease the static twin classes of its GPUs (sorted), the leases sorted: all
    look_ahead needs of the partition (twins are interchangeable), so a memo keyed by it
    serves every partition of the same shape."""
    return tuple(sorted(tuple(sorted(view.twin[p] for p in gpus)) for gpus in leases if gpus))


def servable_after_one_end(view: HostView, census: Census, left: list[int],
                           leases: tuple[tuple[int, ...], ...]) -> int:
    total = 0
    for classes in leases:
        after = list(left)
        for c in classes:
            after[c] += 1
        total += servable(view, census, after)
    return total


def servable(view: HostView, census: Census, left: list[int]) -> int:
    """Summed over the census's sizes: how many disjoint host-minimum sets of that size
    the free GPUs (`left`, per twin class) hold at most. Kept per view by `left` (a class
    mix: at most SERVABLE_MIXES of them)."""
    memo = view.cache.setdefault("servable", {})
    key = tuple(left)
    total = memo.get(key)
    if total is None:
        room = sum(left)
        most = view.cache.setdefault("most_disjoint", {})
        total = memo[key] = sum(_most_disjoint(most, size, mixes, key)
                                for size, mixes in census_by_size(view, census) if size <= room)
    return total


def _most_disjoint(memo: dict, size: int, mixes: list[tuple[tuple[int, int], ...]], left: tuple[int, ...]) -> int:
    """The most size-GPU mixes (each usable again) that fit in `left` together; kept in
    `memo` by (size, left), so the mixes left after taking one are shared by every query
    that reaches them. Stops once the room divided by the size is met."""
    key = (size, left)
    best = memo.get(key)
    if best is not None:
        return best
    best = 0
    bound = sum(left) // size
    if bound:
        for mix in mixes:
            if all(left[c] >= count for c, count in mix):
                rest = list(left)
                for c, count in mix:
                    rest[c] -= count
                best = max(best, 1 + _most_disjoint(memo, size, mixes, tuple(rest)))
                if best >= bound:
                    break
    memo[key] = best
    return best


def census_by_size(view: HostView, census: Census) -> list[tuple[int, list[tuple[tuple[int, int], ...]]]]:
    cached = view.cache.get("census_by_size")
    if cached is None:
        sizes: dict[int, list] = {}
        for size, mix in census:
            sizes.setdefault(size, []).append(mix)
        cached = view.cache["census_by_size"] = sorted(sizes.items())
    return cached


def sets_left(view: HostView, census: Census, left: list[int]) -> int:
    memo = view.cache.setdefault("sets_left", {})
    key = tuple(left)
    score = memo.get(key)
    if score is None:
        score = memo[key] = _sets_left(census, left, sum(left))
    return score


def _sets_left(census: Census, left: list[int], room: int) -> int:
    total = 0
    for size, mix in census:
        if size > room:
            break  # the census is ordered by size
        ways = 1
        for c, count in mix:
            ways *= comb(left[c], count)  # 0 once count exceeds what is left
            if not ways:
                break
        total += ways
    return total


def phi_of(view: HostView, busy: set[int]) -> list[float]:
    """phi of every position with `busy` taken, kept per view by the busy set (far fewer
    of them than free states: the CPUs and NICs leases hold do not change it).

    GPUs with the same groups (a switch's) have the same phi, a function of the busy GPUs
    within those groups alone: per such kind it is kept by those busy GPUs (as bits), so
    a new busy set recomputes only the kinds whose groups it changed. Each value is the
    per-GPU formula's expression in its order: the same floats."""
    taken = busy_bits(view, busy)
    memo = view.cache.setdefault("phi", {})
    phi = memo.get(taken)
    if phi is None:
        phi = list(map(kind_phi(view, taken).__getitem__, group_kinds(view)[1]))
        if len(memo) >= PHI_MEMO_GPUS // max(view.n, 1):
            del memo[next(iter(memo))]
        memo[taken] = phi
    return phi


def busy_bits(view: HostView, busy: set[int]) -> int:
    """The busy positions as one int's bits (distinct powers of two: their sum is their OR)."""
    bit = view.cache.get("bits")
    if bit is None:
        bit = view.cache["bits"] = [1 << p for p in range(view.n)]
    return sum(map(bit.__getitem__, busy))


def kind_phi(view: HostView, taken: int) -> list[float]:
    """phi per GPU kind (see phi_of) with the positions in `taken` busy."""
    _, sizes = group_index(view)
    kinds, _, masks, spans, known_of = group_kinds(view)
    per_kind = []
    for groups, span, known in zip(kinds, spans, known_of):
        value = known.get(taken & span)
        if value is None:
            value = phi_value(groups, sizes, masks, taken, known, span)
        per_kind.append(value)
    return per_kind


def phi_value(groups: tuple[int, ...], sizes: list[int], masks: list[int], taken: int, known: dict,
               span: int) -> float:
    """phi of a GPU in `groups` with `taken` busy (the per-GPU formula's expression, in
    its order), kept in the kind's memo `known` by the busy bits within `span`."""
    if len(known) >= KIND_MEMO:
        known.clear()
    value = known[taken & span] = (sum([(sizes[i] - (taken & masks[i]).bit_count()) / sizes[i] for i in groups])
                                   / len(groups) if groups else 1.0)
    return value


def group_index(view: HostView) -> tuple[list[tuple[int, ...]], list[int]]:
    """Groups numbered once per view: per position its group numbers, and each group's
    size (a group key is a tuple, hashed again at every lookup; an int is not)."""
    cached = view.cache.get("group_index")
    if cached is None:
        number = {key: i for i, key in enumerate(view.group_size)}
        members = [tuple(number[key] for key in keys) for keys in view.groups]
        cached = view.cache["group_index"] = (members, list(view.group_size.values()))
    return cached


def group_kinds(view: HostView) -> tuple[list[tuple[int, ...]], list[int], list[int], list[int], list[dict]]:
    """The distinct group-number tuples of the view's positions (kinds), per position its
    kind, per group its positions as a bit mask, per kind the positions of all its groups
    as one mask, and per kind its phi memo (busy bits within that mask -> phi)."""
    cached = view.cache.get("group_kinds")
    if cached is None:
        members, sizes = group_index(view)
        number: dict[tuple[int, ...], int] = {}
        kind_of = [number.setdefault(groups, len(number)) for groups in members]
        masks = [0] * len(sizes)
        for p, groups in enumerate(members):
            for i in groups:
                masks[i] |= 1 << p
        kinds = list(number)
        spans = []
        for groups in kinds:
            span = 0
            for i in groups:
                span |= masks[i]
            spans.append(span)
        cached = view.cache["group_kinds"] = (kinds, kind_of, masks, spans, [{} for _ in kinds])
    return cached
