"""Ring AllReduce schedule and the formulas used to report it (nccl-tests PERFORMANCE.md).

The ring is ReduceScatter then AllGather: 2(n-1) steps; at each step rank r sends one chunk to
rank r+1 and receives one from rank r-1. In ReduceScatter the received chunk is added to the
local one; in AllGather it replaces it. The chunk sent at step t is the one received at step
t-1, which is what lets a worker stream slices through the ring without a barrier per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REDUCE, COPY = "reduce", "copy"


@dataclass(frozen=True)
class Step:
    send_chunk: int
    recv_chunk: int
    op: str


def ring_schedule(rank: int, world: int) -> list[Step]:
    """The 2(world-1) steps rank ``rank`` performs."""
    if world < 2 or not 0 <= rank < world:
        raise ValueError(f"bad rank {rank} for world {world}")
    steps = [Step((rank - s) % world, (rank - s - 1) % world, REDUCE) for s in range(world - 1)]
    steps += [Step((rank + 1 - s) % world, (rank - s) % world, COPY) for s in range(world - 1)]
    return steps


def chunk_bounds(n_elems: int, world: int) -> list[tuple[int, int]]:
    """[start, end) element ranges of the world chunks (sizes differ by at most one)."""
    base, extra = divmod(n_elems, world)
    bounds, start = [], 0
    for c in range(world):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def slice_bounds(start: int, end: int, slice_elems: int) -> list[tuple[int, int]]:
    """Split [start, end) into consecutive slices of at most ``slice_elems`` elements."""
    return [(s, min(s + slice_elems, end)) for s in range(start, end, slice_elems)] or [(start, end)]


def rank_data(rank: int, n_elems: int, seed: int) -> np.ndarray:
    """Rank's input: integer-valued float32 in [-1000, 1000], so sums are exact in any order."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-1000, 1001, size=n_elems, dtype=np.int32).astype(np.float32)


def expected_sum(world: int, n_elems: int, seed: int) -> np.ndarray:
    total = np.zeros(n_elems, dtype=np.float32)
    for r in range(world):
        total += rank_data(r, n_elems, seed)
    return total


def algbw_gbyte(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth S/t in GB/s."""
    return size_bytes / seconds / 1e9


def allreduce_busbw_factor(world: int) -> float:
    """busbw = algbw * 2(n-1)/n for AllReduce."""
    return 2 * (world - 1) / world
