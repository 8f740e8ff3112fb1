"""The executor: slice dependencies checked by hand, every collective run end to end over the
in-process transport with its result checked on every rank, slices streaming through the
schedule (a chain only completes if a rank forwards a slice before the next arrives), reuse
across runs, and failures surfacing instead of hanging."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.unit.ranks import run_ranks
from testbed.traffic.collectives import algorithms as alg
from testbed.traffic.collectives.data import ALGORITHMS, ALLREDUCE, op_sizes
from testbed.traffic.collectives.executor import Executor, plan_rank
from testbed.traffic.collectives.runner import PreparedCollective, lane_count
from testbed.traffic.collectives.schedule import RECV, SEND
from testbed.traffic.collectives.transport import close_local, local_transports

SEED = 3
SPLIT_BYTES = 8  # split messages across channels even when tiny


@pytest.fixture
def world_of():
    made = []

    def make(world, channels=1):
        made.append(local_transports(world, channels, min_part_bytes=SPLIT_BYTES))
        return made[-1]

    yield make
    for transports in made:
        close_local(transports)


def groups_of(world: int) -> list[list[int]]:
    return [list(range(i, min(world, i + 3))) for i in range(0, world, 3)]


def run_collective(transports, op, algorithm, size_bytes, slice_bytes, runs=1) -> list[int]:
    """Run ``op`` on every rank ``runs`` times (fresh inputs each time); #wrong per rank."""
    world = len(transports)
    sizes = op_sizes(op, size_bytes, world)
    root = world - 1

    def rank_main(rank):
        with Executor(transports[rank]) as executor, \
                PreparedCollective(executor, sizes, algorithm, SEED, slice_bytes, root,
                                   groups_of(world)) as coll:
            wrong = 0
            for _ in range(runs):
                coll.reset()
                coll.run()
                wrong += coll.wrong()
            return wrong

    return run_ranks(world, rank_main)


# --- plans --------------------------------------------------------------------------------------


def test_ring_plan_dependencies_world_3_rank_1_by_hand():
    plan = plan_rank(alg.ring_allreduce(3, 6), 1, slice_elems=1)
    got = [(t.kind, t.peer, t.region.start, t.region.end, t.deps) for t in plan.tasks]
    assert got == [
        # step 0: send own chunk 0 (no dependency), reduce chunk 2 from rank 0
        (SEND, 2, 0, 1, ()), (SEND, 2, 1, 2, ()), (RECV, 0, 4, 5, ()), (RECV, 0, 5, 6, ()),
        # step 1: forward each slice of chunk 2 once it is reduced
        (SEND, 2, 4, 5, (2,)), (SEND, 2, 5, 6, (3,)), (RECV, 0, 2, 3, ()), (RECV, 0, 3, 4, ()),
        # step 2 (AllGather): overwrite chunk 0 only after its step-0 send went out
        (SEND, 2, 2, 3, (6,)), (SEND, 2, 3, 4, (7,)), (RECV, 0, 0, 1, (0,)), (RECV, 0, 1, 2, (1,)),
        # step 3: chunk 2 was last written at step 0 and read at step 1
        (SEND, 2, 0, 1, (10,)), (SEND, 2, 1, 2, (11,)), (RECV, 0, 4, 5, (2, 4)), (RECV, 0, 5, 6, (3, 5)),
    ]
    assert plan.send_queues == {2: (0, 1, 4, 5, 8, 9, 12, 13)}
    assert plan.recv_queues == {0: (2, 3, 6, 7, 10, 11, 14, 15)}


@pytest.mark.parametrize("world", [2, 5, 8])
@pytest.mark.parametrize("slice_elems", [1, 3, 1000])
def test_plans_depend_only_on_earlier_tasks_and_cover_every_element(world, slice_elems):
    n = 97
    for schedule in (alg.ring_allreduce(world, n), alg.halving_doubling_allreduce(world, n),
                     alg.tree_allreduce(world, n), alg.chain_broadcast(world, n, 1)):
        for rank in range(world):
            plan = plan_rank(schedule, rank, slice_elems)
            for i, task in enumerate(plan.tasks):
                assert all(d < i for d in task.deps)
                assert 0 < task.region.size <= slice_elems
            for kind in (SEND, RECV):
                planned = sum(t.region.size for t in plan.tasks if t.kind == kind)
                scheduled = sum(op.region.size for ops in schedule.steps[rank] for op in ops
                                if op.kind == kind)
                assert planned == scheduled


def test_plan_refuses_empty_slices():
    with pytest.raises(ValueError):
        plan_rank(alg.ring_allreduce(2, 4), 0, 0)


# --- end to end over the in-process transport ---------------------------------------------------


CASES = [(op, a) for op, algos in ALGORITHMS.items() for a in algos]


@pytest.mark.parametrize(("op", "algorithm"), CASES)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 8, 12])
def test_every_collective_is_exact_on_every_rank(world_of, op, algorithm, world):
    transports = world_of(world, channels=2)
    for size_bytes, slice_bytes in ((4, 4), (4 * 1001, 4 * 37), (4 * 24_000, 4 * 4096)):
        assert run_collective(transports, op, algorithm, size_bytes, slice_bytes) == [0] * world


@pytest.mark.parametrize(("op", "algorithm"), [("allreduce", "ring"), ("allreduce", "hd"),
                                               ("alltoall", "pairwise"), ("broadcast", "tree")])
def test_collectives_repeat_on_the_same_connections(world_of, op, algorithm):
    """Nothing of one run leaks into the next."""
    transports = world_of(5, channels=3)
    assert run_collective(transports, op, algorithm, 4 * 5003, 4 * 100, runs=3) == [0] * 5


def test_alltoallv_runs_with_uneven_counts(world_of):
    counts = [[0, 2, 5], [1, 0, 0], [3, 4, 1]]
    schedule = alg.pairwise_alltoall(3, counts)
    transports = world_of(3)
    inputs = [np.arange(schedule.input_elems[r], dtype=np.float32) + 100 * r for r in range(3)]

    def rank_main(rank):
        work = np.full(schedule.work_elems[rank], -1, dtype=np.float32)
        with Executor(transports[rank]) as executor:
            executor.run(plan_rank(schedule, rank, 2), work, inputs[rank])
        return work

    out = run_ranks(3, rank_main)
    np.testing.assert_array_equal(out[0], [100, 200, 201, 202])
    np.testing.assert_array_equal(out[1], [0, 1, 203, 204, 205, 206])
    np.testing.assert_array_equal(out[2], [2, 3, 4, 5, 6, 207])


class GatedTransport:
    """Rank 0's transport holds its second slice until ``gate`` opens."""

    def __init__(self, inner, gate: threading.Event):
        self.inner, self.gate = inner, gate
        self.rank, self.world = inner.rank, inner.world
        self.sent = 0

    def send(self, peer, data):
        if self.sent == 1:
            assert self.gate.wait(10.0), "the first slice never reached the end of the chain"
        self.sent += 1
        self.inner.send(peer, data)

    def recv(self, peer, out):
        self.inner.recv(peer, out)


def test_slices_stream_through_a_chain(world_of):
    """The chain's last rank gets slice 0 while the root still holds slice 1: each rank
    forwards a slice as soon as it arrives, not after its whole step."""
    world, n = 4, 8
    transports = world_of(world)
    gate = threading.Event()
    schedule = alg.chain_broadcast(world, n, root=0)

    class LastRankOpens:
        def __init__(self, inner):
            self.inner, self.rank, self.world = inner, inner.rank, inner.world

        def send(self, peer, data):
            self.inner.send(peer, data)

        def recv(self, peer, out):
            self.inner.recv(peer, out)
            gate.set()

    wrapped = [GatedTransport(transports[0], gate), transports[1], transports[2],
               LastRankOpens(transports[3])]
    data = np.arange(n, dtype=np.float32)

    def rank_main(rank):
        work = data.copy() if rank == 0 else np.zeros(n, dtype=np.float32)
        with Executor(wrapped[rank]) as executor:
            executor.run(plan_rank(schedule, rank, 2), work)
        return work

    for work in run_ranks(world, rank_main):
        np.testing.assert_array_equal(work, data)


def test_a_closed_peer_fails_the_run_instead_of_hanging(world_of):
    transports = world_of(2)
    for writer, _ in transports[0].wires.get(1, 0):
        writer.close()  # rank 1 is gone before sending anything
    plan = plan_rank(alg.ring_allreduce(2, 100), 0, 10)
    with Executor(transports[0]) as executor, pytest.raises(ConnectionError):
        executor.run(plan, np.zeros(100, dtype=np.float32))


def test_buffers_smaller_than_the_plan_are_refused(world_of):
    transports = world_of(2)
    plan = plan_rank(alg.ring_allreduce(2, 100), 0, 10)
    with Executor(transports[0]) as executor, pytest.raises(ValueError, match="smaller"):
        executor.run(plan, np.zeros(99, dtype=np.float32))


def test_prepared_collective_reports_wrong_elements(world_of):
    transports = world_of(1)
    with Executor(transports[0]) as executor:
        coll = PreparedCollective(executor, op_sizes(ALLREDUCE, 400, 1), "ring", SEED)
        coll.run()
        assert coll.wrong() == 0
        coll.work[:7] += 1
        assert coll.wrong() == 7
        coll.reset()
        assert coll.wrong() == 0


def test_channels_run_an_allreduce_as_independent_pipelines_on_disjoint_segments(world_of):
    """As NCCL's channels: the buffer in one segment per channel, each segment's ring on its
    own channel, every message whole on that channel's connection."""
    transports = world_of(4, channels=3)
    sizes = op_sizes(ALLREDUCE, 4 * 1000, 4)
    with Executor(transports[1]) as executor, \
            PreparedCollective(executor, sizes, "ring", SEED, 4 * 64) as coll:
        assert len(coll.lanes) == coll.channels_used == 3
        covered = []
        for (lane_executor, plan), c in zip(coll.lanes, range(3)):
            assert lane_executor.transport.channels == 1
            assert lane_executor.transport.index == c
            regions = {(t.region.start, t.region.end) for t in plan.tasks}
            covered.append((min(s for s, _ in regions), max(e for _, e in regions)))
        # 1000 elements in 3 segments: [0, 334), [334, 667), [667, 1000)
        assert covered == [(0, 334), (334, 667), (667, 1000)]
    # an AllGather lays its buffer out by rank: its messages are split instead
    gather = op_sizes("allgather", 4 * 1200, 4)
    with Executor(transports[1]) as executor, \
            PreparedCollective(executor, gather, "ring", SEED, 4 * 64) as coll:
        assert len(coll.lanes) == coll.channels_used == 1


def test_small_messages_take_fewer_channels_as_nccls_tuner_does():
    kib = 1024
    # 16 ranks, 4 channels: a ring step carries a 16th of a channel's segment, >= 16 KiB
    assert lane_count(ALLREDUCE, 1 * kib, 16, 4, 16 * kib) == 1
    assert lane_count(ALLREDUCE, 256 * kib, 16, 4, 16 * kib) == 1
    assert lane_count(ALLREDUCE, 512 * kib, 16, 4, 16 * kib) == 2
    assert lane_count(ALLREDUCE, 2048 * kib, 16, 4, 16 * kib) == 4  # the bundled scenarios
    assert lane_count("broadcast", 32 * kib, 16, 4, 16 * kib) == 2
    assert lane_count("allgather", 2048 * kib, 16, 4, 16 * kib) == 1  # split, not laned


def test_a_channel_view_sends_every_message_whole_on_its_channel(world_of):
    a, b = world_of(2, channels=2)
    data = np.arange(5000, dtype=np.float32)
    out = np.zeros_like(data)
    done = threading.Thread(target=lambda: b.channel(1).recv(0, out))
    done.start()
    a.channel(1).send(1, data)
    done.join(timeout=10)
    assert np.array_equal(out, data)
    with pytest.raises(ValueError):
        a.channel(2)
    assert a.channel(0) is not a and world_of(2, channels=1)[0].channel(0) is not None
