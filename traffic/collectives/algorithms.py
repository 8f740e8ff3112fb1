"""Collective schedules, built by pure functions (plain data, see ``schedule``).

AllReduce:
- ``ring_allreduce``: ReduceScatter then AllGather around the ring, 2(p-1) steps of n/p.
- ``halving_doubling_allreduce``: recursive halving ReduceScatter then recursive doubling
  AllGather between partners rank XOR 2^k (Rabenseifner); for p not a power of two the first
  2r ranks (r = p - 2^floor(log2 p)) pair up first: the even one hands its whole buffer to the
  odd one, sits out, and gets the result back at the end (Thakur, Rabenseifner, Gropp 2005).
- ``tree_allreduce``: double binary tree (as NCCL): each half of the buffer is reduced up one
  tree and broadcast down it; the second tree is the first with the rank order reversed, so
  a rank that is inner in one tree is a leaf in the other.
- ``hierarchical_allreduce``: inside each node group a chain reduces to the group's first
  rank (its leader), the leaders run a ring AllReduce, and a chain broadcasts back.
Others: ring ReduceScatter and AllGather, pairwise-exchange AllToAll (any per-pair counts, for
MoE dispatch and combine), chain (pipelined) and binomial-tree Broadcast.

Conventions: ReduceScatter leaves chunk r (``chunk_bounds(n, p)[r]``) reduced on rank r;
AllGather starts with rank r's contribution in chunk r of its work buffer. The executor
streams slices, so the chain and tree schedules run pipelined.
"""
from __future__ import annotations

from itertools import accumulate

from testbed.traffic.collectives.schedule import (
    INPUT,
    REDUCE,
    REPLACE,
    Phase,
    Region,
    Schedule,
    chunk_bounds,
    local_copy,
    make_schedule,
    new_phase,
    parallel,
    recv,
    send,
)


def _check_world(world: int) -> None:
    if world < 1:
        raise ValueError(f"a collective needs at least one rank, not {world}")


def _exchange(phase: Phase, t: int, src: int, dst: int, src_range, dst_range=None,
              combine: str = REPLACE) -> None:
    """At step t, ``src`` sends elements ``src_range`` and ``dst`` receives them into
    ``dst_range`` (the same range unless given)."""
    lo, hi = src_range
    dlo, dhi = dst_range or src_range
    phase[src][t].append(send(dst, lo, hi))
    phase[dst][t].append(recv(src, dlo, dhi, combine))


# --- rings --------------------------------------------------------------------------------------


def ring_reduce_scatter_phase(world: int, members: list[int], lo: int, hi: int) -> Phase:
    """Ring ReduceScatter of [lo, hi) over ``members`` (ring order): k-1 steps; member i ends
    with chunk i of the range reduced over all members."""
    k = len(members)
    chunks = [(lo + a, lo + b) for a, b in chunk_bounds(hi - lo, k)]
    phase = new_phase(world, k - 1)
    for s in range(k - 1):
        for i, rank in enumerate(members):
            _exchange(phase, s, rank, members[(i + 1) % k], chunks[(i - s - 1) % k],
                      combine=REDUCE)
    return phase


def ring_allgather_phase(world: int, members: list[int], lo: int, hi: int) -> Phase:
    """Ring AllGather of [lo, hi) over ``members``: member i starts with chunk i; k-1 steps."""
    k = len(members)
    chunks = [(lo + a, lo + b) for a, b in chunk_bounds(hi - lo, k)]
    phase = new_phase(world, k - 1)
    for s in range(k - 1):
        for i, rank in enumerate(members):
            _exchange(phase, s, rank, members[(i + 1) % k], chunks[(i - s) % k])
    return phase


def ring_allreduce(world: int, n_elems: int) -> Schedule:
    _check_world(world)
    ranks = list(range(world))
    return make_schedule("ring_allreduce", world,
                         [ring_reduce_scatter_phase(world, ranks, 0, n_elems),
                          ring_allgather_phase(world, ranks, 0, n_elems)], n_elems)


def ring_reduce_scatter(world: int, n_elems: int) -> Schedule:
    """``n_elems``: the whole input of every rank; rank r ends with chunk r."""
    _check_world(world)
    return make_schedule("ring_reduce_scatter", world,
                         [ring_reduce_scatter_phase(world, list(range(world)), 0, n_elems)], n_elems)


def ring_allgather(world: int, n_elems: int) -> Schedule:
    """``n_elems``: the whole output; rank r contributes chunk r."""
    _check_world(world)
    return make_schedule("ring_allgather", world,
                         [ring_allgather_phase(world, list(range(world)), 0, n_elems)], n_elems)


# --- recursive halving-doubling -----------------------------------------------------------------


def power_of_two_below(world: int) -> int:
    """The largest power of two <= world."""
    return 1 << (world.bit_length() - 1)


def halving_doubling_allreduce(world: int, n_elems: int) -> Schedule:
    _check_world(world)
    p2 = power_of_two_below(world)
    rem = world - p2
    # virtual rank v (0..p2-1) -> real rank: the odd rank of each of the first rem pairs,
    # then every rank from 2*rem on
    real = [2 * v + 1 if v < rem else v + rem for v in range(p2)]
    chunks = chunk_bounds(n_elems, p2)

    def span(c0: int, c1: int) -> tuple[int, int]:
        return chunks[c0][0], chunks[c1 - 1][1]

    pre, post = new_phase(world, 1 if rem else 0), new_phase(world, 1 if rem else 0)
    for i in range(rem):
        _exchange(pre, 0, 2 * i, 2 * i + 1, (0, n_elems), combine=REDUCE)
        _exchange(post, 0, 2 * i + 1, 2 * i, (0, n_elems))
    levels = p2.bit_length() - 1
    halving, doubling = new_phase(world, levels), new_phase(world, levels)
    for t in range(levels):
        mask = p2 >> (t + 1)  # p2/2, p2/4, ..., 1
        for v in range(p2):
            base = v & ~(2 * mask - 1)
            lower, upper = span(base, base + mask), span(base + mask, base + 2 * mask)
            give = upper if v & mask == 0 else lower
            _exchange(halving, t, real[v], real[v ^ mask], give, combine=REDUCE)
        mask = 1 << t  # 1, 2, ..., p2/2
        for v in range(p2):
            base = v & ~(mask - 1)
            _exchange(doubling, t, real[v], real[v ^ mask], span(base, base + mask))
    return make_schedule("halving_doubling_allreduce", world, [pre, halving, doubling, post],
                         n_elems)


# --- trees --------------------------------------------------------------------------------------


def heap_tree(order: list[int]) -> dict[int, tuple[int | None, list[int], int]]:
    """A binary tree laid out as a heap over ``order``: position i's parent is (i-1)//2.
    Returns rank -> (parent, children, depth)."""
    tree = {}
    for i, rank in enumerate(order):
        parent = order[(i - 1) // 2] if i else None
        children = [order[c] for c in (2 * i + 1, 2 * i + 2) if c < len(order)]
        tree[rank] = (parent, children, (i + 1).bit_length() - 1)
    return tree


def double_binary_trees(world: int) -> list[dict]:
    """NCCL's double binary tree idea: two trees whose inner ranks are disjoint. In a heap
    the inner positions are the first floor(p/2), so reversing the order makes them leaves."""
    ranks = list(range(world))
    return [heap_tree(ranks), heap_tree(ranks[::-1])]


def tree_reduce_broadcast_phases(world: int, tree: dict, lo: int, hi: int) -> tuple[Phase, Phase]:
    """Reduce [lo, hi) up ``tree`` to its root, then broadcast it down: depth steps each."""
    depth = max(d for _, _, d in tree.values())
    up, down = new_phase(world, depth), new_phase(world, depth)
    for rank, (parent, _, d) in tree.items():
        if parent is not None:
            _exchange(up, depth - d, rank, parent, (lo, hi), combine=REDUCE)
            _exchange(down, d - 1, parent, rank, (lo, hi))
    return up, down


def tree_allreduce(world: int, n_elems: int) -> Schedule:
    _check_world(world)
    halves = chunk_bounds(n_elems, 2)
    ups, downs = [], []
    for tree, (lo, hi) in zip(double_binary_trees(world), halves):
        up, down = tree_reduce_broadcast_phases(world, tree, lo, hi)
        ups.append(up)
        downs.append(down)
    return make_schedule("tree_allreduce", world,
                         [parallel(world, *ups), parallel(world, *downs)], n_elems)


# --- hierarchical -------------------------------------------------------------------------------


def check_groups(world: int, groups: list[list[int]]) -> None:
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(world)) or any(not g for g in groups):
        raise ValueError(f"node groups {groups} must split ranks 0..{world - 1} into "
                         "non-empty groups")


def chain_phase(world: int, chain: list[int], lo: int, hi: int, toward_head: bool,
                n_steps: int | None = None) -> Phase:
    """A chain over ``chain``: toward the head (reduce into chain[0]) or from it (broadcast)."""
    k = len(chain)
    phase = new_phase(world, k - 1 if n_steps is None else n_steps)
    for s in range(k - 1):
        if toward_head:
            _exchange(phase, s, chain[k - 1 - s], chain[k - 2 - s], (lo, hi), combine=REDUCE)
        else:
            _exchange(phase, s, chain[s], chain[s + 1], (lo, hi))
    return phase


def hierarchical_allreduce(world: int, n_elems: int, groups: list[list[int]]) -> Schedule:
    """``groups``: the ranks of each node; a group's first rank is its leader."""
    _check_world(world)
    check_groups(world, groups)
    steps = max(len(g) for g in groups) - 1
    reduce_in = parallel(world, *(chain_phase(world, g, 0, n_elems, True, steps) for g in groups))
    leaders = [g[0] for g in groups]
    across = [ring_reduce_scatter_phase(world, leaders, 0, n_elems),
              ring_allgather_phase(world, leaders, 0, n_elems)]
    bcast = parallel(world, *(chain_phase(world, g, 0, n_elems, False, steps) for g in groups))
    return make_schedule("hierarchical_allreduce", world, [reduce_in, *across, bcast], n_elems)


# --- AllToAll -----------------------------------------------------------------------------------


def uniform_counts(world: int, block_elems: int) -> list[list[int]]:
    return [[block_elems] * world for _ in range(world)]


def pairwise_alltoall(world: int, counts: list[list[int]]) -> Schedule:
    """``counts[s][d]``: elements rank s sends rank d. Rank s's input holds its blocks for
    d = 0..p-1 in order; rank d's output (work) holds the blocks from s = 0..p-1 in order.
    Step 0 copies the own block; step k sends to (r+k) mod p and receives from (r-k) mod p."""
    _check_world(world)
    if len(counts) != world or any(len(row) != world for row in counts):
        raise ValueError(f"counts must be {world}x{world}")
    send_off = [list(accumulate(row, initial=0)) for row in counts]
    recv_off = [list(accumulate((counts[s][d] for s in range(world)), initial=0))
                for d in range(world)]
    phase = new_phase(world, world)
    for r in range(world):
        if counts[r][r]:
            phase[r][0].append(local_copy(Region(send_off[r][r], send_off[r][r + 1], INPUT),
                                          Region(recv_off[r][r], recv_off[r][r + 1])))
    for k in range(1, world):
        for s in range(world):
            d = (s + k) % world
            if counts[s][d]:
                phase[s][k].append(send(d, send_off[s][d], send_off[s][d + 1], INPUT))
                phase[d][k].append(recv(s, recv_off[d][s], recv_off[d][s + 1]))
    return make_schedule("pairwise_alltoall", world, [phase],
                         [recv_off[d][-1] for d in range(world)],
                         [send_off[s][-1] for s in range(world)])


# --- Broadcast ----------------------------------------------------------------------------------


def chain_broadcast(world: int, n_elems: int, root: int = 0) -> Schedule:
    """root -> root+1 -> ... -> root-1; pipelined by the executor's slices (NCCL's ring
    broadcast)."""
    _check_world(world)
    chain = [(root + i) % world for i in range(world)]
    return make_schedule("chain_broadcast", world,
                         [chain_phase(world, chain, 0, n_elems, False)], n_elems)


def binomial_broadcast(world: int, n_elems: int, root: int = 0) -> Schedule:
    """Binomial tree: at step k every rank that has the data (relative rank v < 2^k) sends it
    to relative rank v + 2^k. ceil(log2 p) steps."""
    _check_world(world)
    steps = (world - 1).bit_length()
    phase = new_phase(world, steps)
    for k in range(steps):
        for v in range(1 << k):
            if v + (1 << k) < world:
                _exchange(phase, k, (v + root) % world, (v + (1 << k) + root) % world,
                          (0, n_elems))
    return make_schedule("binomial_broadcast", world, [phase], n_elems)
