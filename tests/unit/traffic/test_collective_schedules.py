"""Collective schedules as plain data: who sends which element range to whom at every step,
checked by hand on small worlds, by invariants on many world sizes (powers of two and not),
and by running them in lockstep (schedule.simulate) against the expected results."""
from __future__ import annotations

import numpy as np
import pytest

from testbed.traffic.collectives import algorithms as alg
from testbed.traffic.collectives.data import (
    ALGORITHMS,
    build_schedule,
    count_wrong,
    expected_result,
    initial_buffers,
    op_sizes,
)
from testbed.traffic.collectives.schedule import (
    COPY,
    RECV,
    REDUCE,
    REPLACE,
    SEND,
    WORK,
    Region,
    ScheduleError,
    chunk_bounds,
    make_schedule,
    new_phase,
    recv,
    send,
    simulate,
    slice_bounds,
)

WORLDS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
SEED = 7


def groups_of(world: int, per_node: int) -> list[list[int]]:
    return [list(range(i, min(world, i + per_node))) for i in range(0, world, per_node)]


def schedule_for(op: str, algorithm: str, world: int, size_bytes: int, root: int = 0):
    sizes = op_sizes(op, size_bytes, world)
    return sizes, build_schedule(op, algorithm, sizes, root, groups_of(world, 3))


def plain(ops) -> list[tuple]:
    """A step's operations as sorted (kind, peer, start, end, combine) tuples."""
    return sorted((op.kind, op.peer, op.region.start, op.region.end, op.combine) for op in ops)


def steps(expected: list[list[tuple]]) -> list[list[tuple]]:
    return [sorted(step) for step in expected]


ALL_CASES = [(op, a) for op, algos in ALGORITHMS.items() for a in algos]


# --- every schedule, every world ----------------------------------------------------------------


@pytest.mark.parametrize(("op", "algorithm"), ALL_CASES)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("size_bytes", [0, 4, 52, 4000, 4004])
def test_simulated_schedule_gives_the_expected_result_on_every_rank(op, algorithm, world, size_bytes):
    root = world // 2
    sizes, schedule = schedule_for(op, algorithm, world, size_bytes, root)
    final = simulate(schedule, [initial_buffers(sizes, r, SEED, root) for r in range(world)])
    for rank in range(world):
        assert count_wrong(final[rank][WORK], expected_result(sizes, rank, SEED, root)) == 0, rank


@pytest.mark.parametrize(("op", "algorithm"), ALL_CASES)
@pytest.mark.parametrize("world", WORLDS)
def test_every_send_meets_a_receive_of_the_same_size_at_the_same_step(op, algorithm, world):
    _, schedule = schedule_for(op, algorithm, world, 4 * 1000 * world)
    transfers = schedule.transfers()  # raises ScheduleError otherwise
    assert len(transfers) == sum(1 for r in range(world) for ops in schedule.steps[r]
                                 for op in ops if op.kind == SEND)
    for tr in transfers:
        assert tr.src != tr.dst
        assert tr.src_region.size == tr.dst_region.size > 0
        assert 0 <= tr.dst_region.start and tr.dst_region.end <= schedule.work_elems[tr.dst]
    for r in range(world):
        assert len(schedule.steps[r]) == schedule.n_steps


@pytest.mark.parametrize("world", WORLDS)
def test_step_counts(world):
    n = 1000 * world
    log2_floor = world.bit_length() - 1
    extra = 0 if world == 1 << log2_floor else 2
    assert alg.ring_allreduce(world, n).n_steps == 2 * (world - 1)
    assert alg.ring_reduce_scatter(world, n).n_steps == world - 1
    assert alg.ring_allgather(world, n).n_steps == world - 1
    assert alg.halving_doubling_allreduce(world, n).n_steps == 2 * log2_floor + extra
    assert alg.tree_allreduce(world, n).n_steps == 2 * log2_floor
    assert alg.chain_broadcast(world, n).n_steps == world - 1
    assert alg.binomial_broadcast(world, n).n_steps == (world - 1).bit_length()
    assert alg.pairwise_alltoall(world, alg.uniform_counts(world, 10)).n_steps == world


def sent_elems(schedule, rank: int) -> int:
    return sum(op.region.size for ops in schedule.steps[rank] for op in ops if op.kind == SEND)


@pytest.mark.parametrize("world", WORLDS)
def test_bandwidth_optimal_schedules_send_2_p_minus_1_over_p_of_the_buffer(world):
    n = 720720  # divisible by every world size tested
    for schedule in (alg.ring_allreduce(world, n), alg.halving_doubling_allreduce(world, n)):
        if schedule.name.startswith("halving") and world & (world - 1):
            continue  # the pre and post steps move whole buffers, checked below
        for rank in range(world):
            assert sent_elems(schedule, rank) == 2 * (world - 1) * n // world
    for rank in range(world):
        assert sent_elems(alg.ring_allgather(world, n), rank) == (world - 1) * n // world
        assert sent_elems(alg.ring_reduce_scatter(world, n), rank) == (world - 1) * n // world


def test_halving_doubling_non_power_of_two_pre_and_post_steps_move_whole_buffers():
    world, n = 6, 24
    s = alg.halving_doubling_allreduce(world, n)
    # ranks 0 and 2 give everything to 1 and 3, sit out, and get the result back
    assert plain(s.steps[0][0]) == [(SEND, 1, 0, 24, REPLACE)]
    assert plain(s.steps[1][0]) == [(RECV, 0, 0, 24, REDUCE)]
    assert plain(s.steps[2][0]) == [(SEND, 3, 0, 24, REPLACE)]
    assert all(not s.steps[0][t] for t in range(1, 5))
    assert plain(s.steps[0][5]) == [(RECV, 1, 0, 24, REPLACE)]
    assert plain(s.steps[3][5]) == [(SEND, 2, 0, 24, REPLACE)]
    assert not s.steps[4][0] and not s.steps[4][5]
    # virtual ranks 0..3 are real ranks 1, 3, 4, 5: first exchange at distance 2
    assert {op.peer for op in s.steps[1][1]} == {4}
    assert {op.peer for op in s.steps[3][1]} == {5}
    assert {op.peer for op in s.steps[1][2]} == {3}


# --- hand-checked examples ----------------------------------------------------------------------


def test_ring_world_3_rank_1():
    s = alg.ring_allreduce(3, 6)  # chunks (0,2) (2,4) (4,6)
    assert [plain(ops) for ops in s.steps[1]] == steps([
        [(SEND, 2, 0, 2, REPLACE), (RECV, 0, 4, 6, REDUCE)],
        [(SEND, 2, 4, 6, REPLACE), (RECV, 0, 2, 4, REDUCE)],
        [(SEND, 2, 2, 4, REPLACE), (RECV, 0, 0, 2, REPLACE)],
        [(SEND, 2, 0, 2, REPLACE), (RECV, 0, 4, 6, REPLACE)],
    ])


def test_ring_sends_at_each_step_what_it_received_at_the_previous_one():
    for world in (3, 5, 8):
        s = alg.ring_allreduce(world, 10 * world)
        for rank in range(world):
            steps = s.steps[rank]
            for prev, cur in zip(steps, steps[1:]):
                sent = [op.region for op in cur if op.kind == SEND]
                got = [op.region for op in prev if op.kind == RECV]
                assert sent == got


def test_halving_doubling_world_4_rank_0():
    s = alg.halving_doubling_allreduce(4, 8)  # chunks of 2
    assert [plain(ops) for ops in s.steps[0]] == steps([
        [(SEND, 2, 4, 8, REPLACE), (RECV, 2, 0, 4, REDUCE)],   # halving, distance 2
        [(SEND, 1, 2, 4, REPLACE), (RECV, 1, 0, 2, REDUCE)],   # halving, distance 1
        [(SEND, 1, 0, 2, REPLACE), (RECV, 1, 2, 4, REPLACE)],  # doubling, distance 1
        [(SEND, 2, 0, 4, REPLACE), (RECV, 2, 4, 8, REPLACE)],  # doubling, distance 2
    ])


def test_double_binary_tree_world_5():
    tree_a, tree_b = alg.double_binary_trees(5)
    assert tree_a[0] == (None, [1, 2], 0)
    assert tree_a[1] == (0, [3, 4], 1)
    assert tree_a[4] == (1, [], 2)
    assert tree_b[4] == (None, [3, 2], 0)
    assert tree_b[3] == (4, [1, 0], 1)
    s = alg.tree_allreduce(5, 10)  # tree A reduces (0,5), tree B (5,10), at the same time
    # step 0: rank 3, a leaf of A, sends up A while, inner in B, it reduces its B children
    assert plain(s.steps[3][0]) == sorted([(SEND, 1, 0, 5, REPLACE), (RECV, 1, 5, 10, REDUCE),
                                           (RECV, 0, 5, 10, REDUCE)])
    assert plain(s.steps[1][0]) == sorted([(RECV, 3, 0, 5, REDUCE), (RECV, 4, 0, 5, REDUCE),
                                           (SEND, 3, 5, 10, REPLACE)])
    # broadcast: A's root sends at step 2; B's depth-1 rank 3 reaches rank 0 at step 3
    assert plain(s.steps[0][2]) == [(SEND, 1, 0, 5, REPLACE), (SEND, 2, 0, 5, REPLACE)]
    assert plain(s.steps[0][3]) == [(RECV, 3, 5, 10, REPLACE)]


@pytest.mark.parametrize("world", [w for w in WORLDS if w > 1])
def test_double_binary_trees_have_disjoint_inner_ranks_and_span_all(world):
    trees = alg.double_binary_trees(world)
    inner = [{r for r, (_, children, _) in t.items() if children} for t in trees]
    assert not inner[0] & inner[1]
    for t in trees:
        assert sorted(t) == list(range(world))
        assert sum(1 for parent, _, _ in t.values() if parent is None) == 1
        assert all(len(children) <= 2 for _, children, _ in t.values())


def test_binomial_broadcast_world_5_root_2():
    s = alg.binomial_broadcast(5, 4, root=2)
    pairs = [sorted((tr.src, tr.dst) for tr in s.transfers() if tr.step == t) for t in range(3)]
    assert pairs == [[(2, 3)], [(2, 4), (3, 0)], [(2, 1)]]


def test_chain_broadcast_world_4_root_1():
    s = alg.chain_broadcast(4, 4, root=1)
    assert [(tr.step, tr.src, tr.dst) for tr in s.transfers()] == [(0, 1, 2), (1, 2, 3), (2, 3, 0)]


def test_pairwise_alltoall_world_4_partners_and_blocks():
    s = alg.pairwise_alltoall(4, alg.uniform_counts(4, 3))
    assert [plain(ops) for ops in s.steps[1][1:]] == steps([
        [(SEND, 2, 6, 9, REPLACE), (RECV, 0, 0, 3, REPLACE)],
        [(SEND, 3, 9, 12, REPLACE), (RECV, 3, 9, 12, REPLACE)],
        [(SEND, 0, 0, 3, REPLACE), (RECV, 2, 6, 9, REPLACE)],
    ])
    (copy,) = s.steps[1][0]
    assert copy.kind == COPY and copy.source == Region(3, 6, "input") and copy.region == Region(3, 6)


def test_alltoallv_with_uneven_counts_delivers_every_block():
    counts = [[0, 2, 5], [1, 0, 0], [3, 4, 1]]  # MoE dispatch: tokens per (source, expert rank)
    s = alg.pairwise_alltoall(3, counts)
    assert s.input_elems == (7, 1, 8)
    assert s.work_elems == (4, 6, 6)
    sizes = {(tr.src, tr.dst): tr.src_region.size for tr in s.transfers()}
    assert sizes == {(0, 1): 2, (0, 2): 5, (1, 0): 1, (2, 0): 3, (2, 1): 4}
    inputs = [{"input": np.arange(s.input_elems[r], dtype=np.float32) + 100 * r,
               "work": np.zeros(s.work_elems[r], dtype=np.float32)} for r in range(3)]
    out = simulate(s, inputs)
    # rank 1 receives rank 0's elements 0..1 and rank 2's 3..6 (after its 3 for rank 0)
    np.testing.assert_array_equal(out[1]["work"], [0, 1, 203, 204, 205, 206])
    np.testing.assert_array_equal(out[2]["work"], [2, 3, 4, 5, 6, 207])


def test_hierarchical_world_5_two_nodes():
    s = alg.hierarchical_allreduce(5, 10, [[0, 1, 2], [3, 4]])
    pairs = [sorted((tr.src, tr.dst, tr.combine) for tr in s.transfers() if tr.step == t)
             for t in range(s.n_steps)]
    assert pairs == [
        [(2, 1, REDUCE), (4, 3, REDUCE)],   # chains reduce toward the leaders
        [(1, 0, REDUCE)],
        [(0, 3, REDUCE), (3, 0, REDUCE)],   # leaders' ring: ReduceScatter
        [(0, 3, REPLACE), (3, 0, REPLACE)],  # and AllGather
        [(0, 1, REPLACE), (3, 4, REPLACE)],  # chains broadcast back
        [(1, 2, REPLACE)],
    ]


def test_hierarchical_rejects_groups_that_do_not_split_the_world():
    for groups in ([[0, 1], [2]], [[0, 1], [1, 2, 3]], [[0, 1, 2, 3], []]):
        with pytest.raises(ValueError, match="node groups"):
            alg.hierarchical_allreduce(4, 8, groups)


def test_unmatched_schedules_are_refused():
    phase = new_phase(2, 1)
    phase[0][0].append(send(1, 0, 4))
    phase[1][0].append(recv(0, 0, 3))
    with pytest.raises(ScheduleError, match="sends 4 elements, receives 3"):
        make_schedule("bad", 2, [phase], 4).transfers()
    phase = new_phase(2, 1)
    phase[0][0].append(send(1, 0, 4))
    with pytest.raises(ScheduleError, match="unreceived"):
        make_schedule("bad", 2, [phase], 4).transfers()
    phase = new_phase(2, 1)
    phase[1][0].append(recv(0, 0, 4))
    with pytest.raises(ScheduleError, match="sends it nothing"):
        make_schedule("bad", 2, [phase], 4).transfers()


# --- bounds -------------------------------------------------------------------------------------


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n_elems", [0, 1, 2, 7, 8, 100, 1001])
def test_chunk_bounds_cover_exactly_and_balance(n_elems, parts):
    bounds = chunk_bounds(n_elems, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == n_elems
    for (_, end), (start, _) in zip(bounds, bounds[1:]):
        assert end == start
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def test_chunk_bounds_example():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize(("start", "end"), [(0, 10), (3, 17), (5, 6), (100, 1100)])
@pytest.mark.parametrize("slice_elems", [1, 3, 4, 10, 5000])
def test_slice_bounds_cover_exactly(start, end, slice_elems):
    slices = slice_bounds(start, end, slice_elems)
    assert slices[0][0] == start and slices[-1][1] == end
    sizes = [hi - lo for lo, hi in slices]
    assert all(0 < s <= slice_elems for s in sizes)
    assert all(s == slice_elems for s in sizes[:-1])


def test_slice_bounds_example():
    assert slice_bounds(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]
    assert slice_bounds(4, 4, 3) == [(4, 4)]


def test_shifted_moves_every_work_region_and_sizes_the_buffer():
    from testbed.traffic.collectives.schedule import Region, shifted

    ring = alg.ring_allreduce(3, 6)  # chunks of 2 elements
    moved = shifted(ring, 10, 30)
    assert moved.work_elems == (30, 30, 30) and moved.world == 3
    for before, after in zip(ring.transfers(), moved.transfers()):
        assert after.src_region == Region(before.src_region.start + 10,
                                          before.src_region.end + 10)
        assert after.dst_region.start == before.dst_region.start + 10
