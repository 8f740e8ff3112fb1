"""The arithmetic the checks rest on: per-rank inputs, exact sums in any order, nccl-tests'
sizes and counts, and #wrong."""
from __future__ import annotations

import numpy as np
import pytest

from testbed.traffic.collectives.data import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCESCATTER,
    build_schedule,
    count_wrong,
    expected_result,
    expected_sum,
    initial_buffers,
    op_sizes,
    rank_data,
)
from testbed.traffic.collectives.schedule import INPUT, WORK


def test_rank_data_is_integer_valued_bounded_and_deterministic():
    a = rank_data(3, 10_000, seed=5)
    assert a.dtype == np.float32 and a.shape == (10_000,)
    np.testing.assert_array_equal(a, np.round(a))
    assert a.min() >= -1000 and a.max() <= 1000
    np.testing.assert_array_equal(a, rank_data(3, 10_000, seed=5))
    assert not np.array_equal(a, rank_data(4, 10_000, seed=5))
    assert not np.array_equal(a, rank_data(3, 10_000, seed=6))
    np.testing.assert_array_equal(rank_data(3, 100, seed=5), a[:100])


@pytest.mark.parametrize("world", [2, 5, 16])
def test_expected_sum_is_exact_in_any_order(world):
    n_elems, seed = 4096, 11
    exact = sum(rank_data(r, n_elems, seed).astype(np.int64) for r in range(world))
    total = expected_sum(world, n_elems, seed)
    assert total.dtype == np.float32
    np.testing.assert_array_equal(total.astype(np.int64), exact)
    reverse = np.zeros(n_elems, dtype=np.float32)
    for r in reversed(range(world)):
        reverse += rank_data(r, n_elems, seed)
    np.testing.assert_array_equal(reverse, total)


def test_expected_sum_by_hand():
    # world 2, 3 elements: written out from the two ranks' inputs
    a, b = rank_data(0, 3, 1), rank_data(1, 3, 1)
    np.testing.assert_array_equal(expected_sum(2, 3, 1), [a[0] + b[0], a[1] + b[1], a[2] + b[2]])


@pytest.mark.parametrize(("op", "size_bytes", "world", "count", "size_out"), [
    (ALLREDUCE, 1000, 3, 250, 1000),
    (ALLREDUCE, 1001, 3, 250, 1000),     # whole float32 elements
    (BROADCAST, 8, 4, 2, 8),
    (ALLGATHER, 1000, 3, 83, 996),      # 250 elements: 83 per rank, 249 in all
    (REDUCESCATTER, 1000, 3, 83, 996),
    (ALLTOALL, 1000, 3, 83, 996),       # 83 elements per peer
    (ALLGATHER, 8, 4, 0, 0),            # fewer elements than ranks: nothing to move
])
def test_op_sizes_as_nccl_tests_counts_them(op, size_bytes, world, count, size_out):
    sizes = op_sizes(op, size_bytes, world)
    assert (sizes.count, sizes.size_bytes, sizes.total_elems) == (count, size_out, size_out // 4)


def test_op_sizes_refuses_unknown_collectives():
    with pytest.raises(ValueError, match="unknown collective"):
        op_sizes("reduce", 8, 2)


def test_build_schedule_checks_the_algorithm():
    sizes = op_sizes(ALLREDUCE, 64, 4)
    with pytest.raises(ValueError, match="no algorithm"):
        build_schedule(ALLREDUCE, "pairwise", sizes)
    with pytest.raises(ValueError, match="node groups"):
        build_schedule(ALLREDUCE, "hierarchical", sizes)


def test_count_wrong_counts_exactly_the_corrupted_elements():
    sizes = op_sizes(ALLREDUCE, 4000, 3)
    expected = expected_result(sizes, 1, seed=2)
    work = expected[1].copy()
    assert count_wrong(work, expected) == 0
    work[[0, 17, 999]] += 1
    assert count_wrong(work, expected) == 3


def test_reduce_scatter_is_checked_only_on_the_ranks_own_chunk():
    sizes = op_sizes(REDUCESCATTER, 4 * 12, 3)  # 4 elements per rank
    offset, values = expected_result(sizes, 2, seed=1)
    assert offset == 8 and values.size == 4
    np.testing.assert_array_equal(values, expected_sum(3, 12, 1)[8:12])
    work = np.zeros(12, dtype=np.float32)
    work[8:12] = values
    assert count_wrong(work, (offset, values)) == 0


def test_initial_buffers_and_expected_results_of_the_layouts():
    world, seed = 3, 4
    gather = op_sizes(ALLGATHER, 4 * 6, world)  # 2 elements per rank
    work = initial_buffers(gather, 1, seed)[WORK]
    np.testing.assert_array_equal(work, [0, 0, *rank_data(1, 2, seed), 0, 0])
    np.testing.assert_array_equal(expected_result(gather, 0, seed)[1],
                                  np.concatenate([rank_data(r, 2, seed) for r in range(world)]))
    a2a = op_sizes(ALLTOALL, 4 * 6, world)
    bufs = initial_buffers(a2a, 2, seed)
    np.testing.assert_array_equal(bufs[INPUT], rank_data(2, 6, seed))
    # rank 2 gets block 2 (elements 4..5) of every rank's input, in source order
    np.testing.assert_array_equal(expected_result(a2a, 2, seed)[1],
                                  np.concatenate([rank_data(s, 6, seed)[4:6] for s in range(world)]))
    bcast = op_sizes(BROADCAST, 4 * 5, world)
    np.testing.assert_array_equal(initial_buffers(bcast, 1, seed, root=1)[WORK], rank_data(1, 5, seed))
    assert not initial_buffers(bcast, 0, seed, root=1)[WORK].any()
