"""The collectives as nccl-tests runs them: sizes, each rank's input from a seed, the
expected result and the count of wrong elements.

Inputs are integer-valued float32 in [-1000, 1000], so sums are exact in any order and every
rank can check its result element by element. Sizes follow nccl-tests: ``size_bytes`` is the
largest buffer a rank holds (the AllReduce buffer, AllGather's output, ReduceScatter's input,
AllToAll's send buffer) and ``count`` the element count nccl-tests prints (per rank for
AllGather and ReduceScatter, per peer for AllToAll).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.traffic.collectives import algorithms
from testbed.traffic.collectives.cost import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, REDUCESCATTER
from testbed.traffic.collectives.schedule import INPUT, WORK, Schedule

OPS = (ALLREDUCE, REDUCESCATTER, ALLGATHER, ALLTOALL, BROADCAST)
# operation -> algorithms, the first being the default
ALGORITHMS = {
    ALLREDUCE: ("ring", "hd", "tree", "hierarchical"),
    REDUCESCATTER: ("ring",),
    ALLGATHER: ("ring",),
    ALLTOALL: ("pairwise",),
    BROADCAST: ("ring", "tree"),
}
DTYPE = np.float32
TYPE_NAME, REDOP = "float", "sum"
ITEMSIZE = np.dtype(DTYPE).itemsize


@dataclass(frozen=True)
class Sizes:
    """One size of a sweep: ``count`` as nccl-tests prints it, ``size_bytes`` the largest
    buffer, ``total_elems`` the elements of that buffer."""

    op: str
    world: int
    count: int
    size_bytes: int
    total_elems: int

    def resized(self, total_elems: int) -> Sizes:
        """The same collective on ``total_elems`` elements (a channel's segment of an
        element-wise collective)."""
        return Sizes(self.op, self.world, total_elems, total_elems * ITEMSIZE, total_elems)


def op_sizes(op: str, size_bytes: int, world: int) -> Sizes:
    """The sizes nccl-tests uses for a requested ``size_bytes``: rounded down to whole
    elements, and to a multiple of the world where the buffer is split per rank."""
    elems = size_bytes // ITEMSIZE
    if op in (ALLREDUCE, BROADCAST):
        count, total = elems, elems
    elif op in (REDUCESCATTER, ALLGATHER, ALLTOALL):
        count = elems // world
        total = count * world
    else:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    return Sizes(op, world, count, total * ITEMSIZE, total)


def check_algorithm(op: str, algorithm: str) -> None:
    if op not in ALGORITHMS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if algorithm not in ALGORITHMS[op]:
        raise ValueError(f"{op} has no algorithm {algorithm!r}; known: {', '.join(ALGORITHMS[op])}")


def build_schedule(op: str, algorithm: str, sizes: Sizes, root: int = 0,
                   groups: list[list[int]] | None = None) -> Schedule:
    """The schedule of ``op`` with ``algorithm`` for ``sizes``."""
    check_algorithm(op, algorithm)
    world, total = sizes.world, sizes.total_elems
    if op == ALLREDUCE:
        if algorithm == "hierarchical":
            if not groups:
                raise ValueError("the hierarchical AllReduce needs node groups")
            return algorithms.hierarchical_allreduce(world, total, groups)
        return {"ring": algorithms.ring_allreduce, "hd": algorithms.halving_doubling_allreduce,
                "tree": algorithms.tree_allreduce}[algorithm](world, total)
    if op == REDUCESCATTER:
        return algorithms.ring_reduce_scatter(world, total)
    if op == ALLGATHER:
        return algorithms.ring_allgather(world, total)
    if op == ALLTOALL:
        return algorithms.pairwise_alltoall(world, algorithms.uniform_counts(world, sizes.count))
    builder = algorithms.chain_broadcast if algorithm == "ring" else algorithms.binomial_broadcast
    return builder(world, total, root)


def rank_data(rank: int, n_elems: int, seed: int) -> np.ndarray:
    """Rank's input: integer-valued float32 in [-1000, 1000], so sums are exact in any order."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-1000, 1001, size=n_elems, dtype=np.int32).astype(DTYPE)


def expected_sum(world: int, n_elems: int, seed: int) -> np.ndarray:
    """The element-wise sum of every rank's ``rank_data``."""
    total = np.zeros(n_elems, dtype=DTYPE)
    for r in range(world):
        total += rank_data(r, n_elems, seed)
    return total


def initial_buffers(sizes: Sizes, rank: int, seed: int, root: int = 0) -> dict[str, np.ndarray]:
    """Rank's buffers before the collective: ``work`` (and ``input`` for AllToAll)."""
    op, n, count = sizes.op, sizes.total_elems, sizes.count
    if op in (ALLREDUCE, REDUCESCATTER):
        return {WORK: rank_data(rank, n, seed)}
    if op == ALLGATHER:
        work = np.zeros(n, dtype=DTYPE)
        work[rank * count:(rank + 1) * count] = rank_data(rank, count, seed)
        return {WORK: work}
    if op == ALLTOALL:
        return {WORK: np.zeros(n, dtype=DTYPE), INPUT: rank_data(rank, n, seed)}
    work = rank_data(root, n, seed) if rank == root else np.zeros(n, dtype=DTYPE)
    return {WORK: work}


def expected_result(sizes: Sizes, rank: int, seed: int, root: int = 0) -> tuple[int, np.ndarray]:
    """(offset, values): what rank's work buffer must hold from ``offset`` on."""
    op, world, n, count = sizes.op, sizes.world, sizes.total_elems, sizes.count
    if op == ALLREDUCE:
        return 0, expected_sum(world, n, seed)
    if op == REDUCESCATTER:
        return rank * count, expected_sum(world, n, seed)[rank * count:(rank + 1) * count]
    if op == ALLGATHER:
        return 0, np.concatenate([rank_data(r, count, seed) for r in range(world)])
    if op == ALLTOALL:
        return 0, np.concatenate([rank_data(s, n, seed)[rank * count:(rank + 1) * count]
                                  for s in range(world)])
    return 0, rank_data(root, n, seed)


def count_wrong(work: np.ndarray, expected: tuple[int, np.ndarray]) -> int:
    """Elements of ``work`` that differ from the expected values (nccl-tests' #wrong)."""
    offset, values = expected
    return int(np.count_nonzero(work[offset:offset + values.size] != values))
