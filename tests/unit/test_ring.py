"""The ring AllReduce schedule, simulated in numpy, and the streaming implementation run for
real over socket pairs between threads (one thread per rank)."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from testbed.traffic.allreduce import allreduce, allreduce_channels, barrier, recv_exact
from testbed.traffic.ring import (
    COPY,
    REDUCE,
    algbw_gbyte,
    allreduce_busbw_factor,
    chunk_bounds,
    expected_sum,
    rank_data,
    ring_schedule,
    slice_bounds,
)

WORLDS = range(2, 10)
SOCKET_TIMEOUT_S = 10.0   # a blocked send or receive fails the rank instead of hanging
JOIN_TIMEOUT_S = 30.0     # a rank thread still alive after this is a deadlock
FLOAT_REL_TOL = 1e-12


# --- schedule ----------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_schedule_has_2n_minus_2_steps_reduce_then_copy(world):
    for rank in range(world):
        steps = ring_schedule(rank, world)
        assert len(steps) == 2 * (world - 1)
        assert [s.op for s in steps] == [REDUCE] * (world - 1) + [COPY] * (world - 1)
        for s in steps:
            assert 0 <= s.send_chunk < world and 0 <= s.recv_chunk < world


@pytest.mark.parametrize("world", WORLDS)
def test_schedule_sends_what_it_received_one_step_earlier(world):
    for rank in range(world):
        steps = ring_schedule(rank, world)
        assert steps[0].send_chunk == rank
        for prev, step in zip(steps, steps[1:]):
            assert step.send_chunk == prev.recv_chunk


@pytest.mark.parametrize("world", WORLDS)
def test_schedule_successor_receives_the_chunk_sent(world):
    for rank in range(world):
        mine, succ = ring_schedule(rank, world), ring_schedule((rank + 1) % world, world)
        assert [s.send_chunk for s in mine] == [s.recv_chunk for s in succ]


def simulate_ring(world: int, n_elems: int, seed: int) -> list[np.ndarray]:
    """Run the schedule in lockstep: every rank sends, then every rank applies what it got."""
    bufs = [rank_data(r, n_elems, seed).astype(np.float64) for r in range(world)]
    chunks = chunk_bounds(n_elems, world)
    schedules = [ring_schedule(r, world) for r in range(world)]
    for t in range(2 * (world - 1)):
        sent = []
        for r in range(world):
            lo, hi = chunks[schedules[r][t].send_chunk]
            sent.append((schedules[r][t].send_chunk, bufs[r][lo:hi].copy()))
        for r in range(world):
            chunk, data = sent[(r - 1) % world]
            step = schedules[r][t]
            assert chunk == step.recv_chunk
            lo, hi = chunks[chunk]
            if step.op == REDUCE:
                bufs[r][lo:hi] += data
            else:
                bufs[r][lo:hi] = data
    return bufs


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("n_elems", [1, 5, 64, 1001])
def test_simulated_schedule_leaves_the_sum_on_every_rank(world, n_elems):
    seed = 7
    total = sum(rank_data(r, n_elems, seed).astype(np.float64) for r in range(world))
    for rank, buf in enumerate(simulate_ring(world, n_elems, seed)):
        np.testing.assert_array_equal(buf, total, err_msg=f"rank {rank}")


@pytest.mark.parametrize(("rank", "world"), [(0, 1), (0, 0), (-1, 4), (4, 4), (5, 3)])
def test_schedule_rejects_bad_rank_or_world(rank, world):
    with pytest.raises(ValueError, match="bad rank"):
        ring_schedule(rank, world)


def test_schedule_world_3_rank_1():
    assert [(s.send_chunk, s.recv_chunk, s.op) for s in ring_schedule(1, 3)] == [
        (1, 0, REDUCE), (0, 2, REDUCE), (2, 1, COPY), (1, 0, COPY)]


# --- bounds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n_elems", [0, 1, 2, 7, 8, 100, 1001])
def test_chunk_bounds_cover_exactly_and_balance(n_elems, world):
    bounds = chunk_bounds(n_elems, world)
    assert len(bounds) == world
    assert bounds[0][0] == 0 and bounds[-1][1] == n_elems
    for (_, end), (start, _) in zip(bounds, bounds[1:]):
        assert end == start
    sizes = [hi - lo for lo, hi in bounds]
    assert min(sizes) >= 0
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger chunks come first


def test_chunk_bounds_example():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize(("start", "end"), [(0, 10), (3, 17), (5, 6), (100, 1100)])
@pytest.mark.parametrize("slice_elems", [1, 3, 4, 10, 5000])
def test_slice_bounds_cover_exactly(start, end, slice_elems):
    slices = slice_bounds(start, end, slice_elems)
    assert slices[0][0] == start and slices[-1][1] == end
    for (_, a_end), (b_start, _) in zip(slices, slices[1:]):
        assert a_end == b_start
    sizes = [hi - lo for lo, hi in slices]
    assert all(0 < s <= slice_elems for s in sizes)
    assert all(s == slice_elems for s in sizes[:-1])
    assert len(slices) == -(-(end - start) // slice_elems)


def test_slice_bounds_of_an_empty_range_is_one_empty_slice():
    assert slice_bounds(4, 4, 3) == [(4, 4)]


def test_slice_bounds_example():
    assert slice_bounds(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]


# --- data and formulas -------------------------------------------------------------------------


def test_rank_data_is_integer_valued_bounded_and_deterministic():
    a = rank_data(3, 10_000, seed=5)
    assert a.dtype == np.float32
    assert a.shape == (10_000,)
    np.testing.assert_array_equal(a, np.round(a))
    assert a.min() >= -1000 and a.max() <= 1000
    np.testing.assert_array_equal(a, rank_data(3, 10_000, seed=5))
    assert not np.array_equal(a, rank_data(4, 10_000, seed=5))
    assert not np.array_equal(a, rank_data(3, 10_000, seed=6))
    np.testing.assert_array_equal(rank_data(3, 100, seed=5), a[:100])


@pytest.mark.parametrize("world", [2, 5, 16])
def test_expected_sum_is_exact(world):
    n_elems, seed = 4096, 11
    exact = sum(rank_data(r, n_elems, seed).astype(np.int64) for r in range(world))
    total = expected_sum(world, n_elems, seed)
    assert total.dtype == np.float32
    np.testing.assert_array_equal(total.astype(np.int64), exact)
    # any summation order gives the same float32 result
    reverse = np.zeros(n_elems, dtype=np.float32)
    for r in reversed(range(world)):
        reverse += rank_data(r, n_elems, seed)
    np.testing.assert_array_equal(reverse, total)


@pytest.mark.parametrize(("world", "factor"), [(2, 1.0), (4, 1.5), (8, 1.75), (16, 1.875)])
def test_busbw_factor(world, factor):
    assert allreduce_busbw_factor(world) == pytest.approx(factor, rel=FLOAT_REL_TOL)
    assert allreduce_busbw_factor(world) == pytest.approx(2 * (world - 1) / world,
                                                          rel=FLOAT_REL_TOL)


def test_algbw_gbyte():
    assert algbw_gbyte(2_000_000_000, 2.0) == pytest.approx(1.0, rel=FLOAT_REL_TOL)
    assert algbw_gbyte(2 * 1024 * 1024, 4.0) == pytest.approx(0.000524288, rel=FLOAT_REL_TOL)


# --- streaming AllReduce over sockets ----------------------------------------------------------


class Rings:
    """``channels`` rings of ``world`` socket pairs: rank r sends on links[c][r][0] and
    receives on links[c][r - 1][1]."""

    def __init__(self, world: int, channels: int = 1):
        self.world = world
        self.links = [[socket.socketpair() for _ in range(world)] for _ in range(channels)]
        for ring in self.links:
            for pair in ring:
                for s in pair:
                    s.settimeout(SOCKET_TIMEOUT_S)

    def pair(self, rank: int, channel: int = 0) -> tuple[socket.socket, socket.socket]:
        ring = self.links[channel]
        return ring[rank][0], ring[(rank - 1) % self.world][1]

    def pairs(self, rank: int) -> list[tuple[socket.socket, socket.socket]]:
        return [self.pair(rank, c) for c in range(len(self.links))]

    def close(self) -> None:
        for ring in self.links:
            for pair in ring:
                for s in pair:
                    s.close()


def run_ranks(world: int, target) -> list[BaseException | None]:
    """Run ``target(rank)`` in one thread per rank; fail if any is still running after the
    join timeout. Returns each rank's exception or None."""
    errors: list[BaseException | None] = [None] * world

    def wrap(rank):
        try:
            target(rank)
        except BaseException as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=wrap, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"ranks {stuck} deadlocked"
    return errors


@pytest.fixture
def rings():
    made = []

    def make(world, channels=1):
        made.append(Rings(world, channels))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize(("n_elems", "slice_elems"), [
    (1, 1),        # fewer elements than ranks: empty chunks
    (7, 1),        # one element per slice
    (7, 3),
    (1000, 7),     # neither divisible by world nor by slice
    (1003, 64),
    (4099, 4099),  # one slice per chunk
    (10_007, 256),
])
def test_allreduce_sums_exactly_on_every_rank(rings, world, n_elems, slice_elems):
    seed = 3
    ring = rings(world)
    bufs = [rank_data(r, n_elems, seed) for r in range(world)]

    def rank_main(rank):
        to_next, from_prev = ring.pair(rank)
        allreduce(bufs[rank], rank, world, to_next, from_prev, slice_elems)

    errors = run_ranks(world, rank_main)
    assert errors == [None] * world
    total = expected_sum(world, n_elems, seed)
    for rank in range(world):
        np.testing.assert_array_equal(bufs[rank], total, err_msg=f"rank {rank}")


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize(("n_elems", "channels", "slice_elems"), [
    (3, 4, 2),        # more channels than elements: some channels reduce nothing
    (1001, 2, 16),
    (5003, 4, 100),
    (65_537, 3, 4096),
])
def test_allreduce_channels_sums_exactly_on_every_rank(rings, world, n_elems, channels, slice_elems):
    seed = 9
    ring = rings(world, channels)
    bufs = [rank_data(r, n_elems, seed) for r in range(world)]

    def rank_main(rank):
        allreduce_channels(bufs[rank], rank, world, ring.pairs(rank), slice_elems)

    errors = run_ranks(world, rank_main)
    assert errors == [None] * world
    total = expected_sum(world, n_elems, seed)
    for rank in range(world):
        np.testing.assert_array_equal(bufs[rank], total, err_msg=f"rank {rank}")


def test_allreduce_repeats_on_the_same_connections(rings):
    """Iterations reuse the connections: nothing of one iteration leaks into the next."""
    world, n_elems, seed = 3, 999, 4
    ring = rings(world, 2)
    total = expected_sum(world, n_elems, seed)
    results = [[] for _ in range(world)]

    def rank_main(rank):
        for _ in range(3):
            buf = rank_data(rank, n_elems, seed)
            barrier(rank, *ring.pair(rank))
            allreduce_channels(buf, rank, world, ring.pairs(rank), 50)
            results[rank].append(buf)

    assert run_ranks(world, rank_main) == [None] * world
    for rank in range(world):
        assert len(results[rank]) == 3
        for buf in results[rank]:
            np.testing.assert_array_equal(buf, total)


def test_allreduce_fails_instead_of_hanging_when_the_predecessor_closes():
    to_next, peer_in = socket.socketpair()
    peer_out, from_prev = socket.socketpair()
    for s in (to_next, peer_in, peer_out, from_prev):
        s.settimeout(SOCKET_TIMEOUT_S)
    peer_out.close()  # the predecessor is gone before sending anything
    buf = rank_data(0, 100, 1)
    try:
        errors = run_ranks(1, lambda _: allreduce(buf, 0, 2, to_next, from_prev, 10))
    finally:
        for s in (to_next, peer_in, from_prev):
            s.close()
    assert isinstance(errors[0], ConnectionError)


def test_recv_exact_reads_across_partial_sends():
    a, b = socket.socketpair()
    a.settimeout(SOCKET_TIMEOUT_S)
    b.settimeout(SOCKET_TIMEOUT_S)
    try:
        out = bytearray(10)
        sender = threading.Thread(target=lambda: [a.sendall(p) for p in (b"abc", b"defg", b"hij")])
        sender.start()
        recv_exact(b, memoryview(out))
        sender.join(JOIN_TIMEOUT_S)
        assert bytes(out) == b"abcdefghij"
        a.close()
        with pytest.raises(ConnectionError):
            recv_exact(b, memoryview(bytearray(1)))
    finally:
        a.close()
        b.close()


def test_barrier_passes_a_token_twice_around_the_ring(rings):
    world = 4
    ring = rings(world)
    passed = []
    lock = threading.Lock()

    def rank_main(rank):
        barrier(rank, *ring.pair(rank))
        with lock:
            passed.append(rank)

    assert run_ranks(world, rank_main) == [None] * world
    assert sorted(passed) == list(range(world))
    # nothing is left in flight on any link
    for c_ring in ring.links:
        for _, receiver in c_ring:
            receiver.setblocking(False)
            with pytest.raises(BlockingIOError):
                receiver.recv(1)
