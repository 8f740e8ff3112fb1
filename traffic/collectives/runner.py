"""A collective made ready to run on one rank: its schedule compiled into this rank's plan,
its input built from the seed, and its result checked against the expected values.
Programs time ``run`` and count ``wrong`` after a fresh ``reset``.

An AllReduce or a Broadcast over a transport with several channels runs as that many
independent pipelines, as NCCL's channels do: the buffer cut into one segment per channel,
each segment's collective on its own channel's connections with its own executor, all at
once. As NCCL's tuner does, a small message takes fewer channels (``lane_count``): every
channel costs each step its own threads and wake-ups, so on 16 ranks a 1 KiB ring AllReduce
on 4 channels took 4 times as long as on one. (Other collectives lay their buffers out by
rank, so their messages are split over the channels instead.)"""
from __future__ import annotations

import numpy as np

from concurrent.futures import ThreadPoolExecutor

from testbed.traffic.collectives.cost import ALLREDUCE, BROADCAST
from testbed.traffic.collectives.data import (
    ITEMSIZE,
    Sizes,
    build_schedule,
    count_wrong,
    expected_result,
    initial_buffers,
)
from testbed.traffic.collectives.executor import DEFAULT_SLICE_BYTES, Executor, plan_rank, slice_elems_for
from testbed.traffic.collectives.schedule import INPUT, WORK, chunk_bounds, shifted
from testbed.traffic.collectives.transport import MIN_PART_BYTES

CHANNELLED = (ALLREDUCE, BROADCAST)  # element-wise collectives: a segment's is the same kind


def lane_count(op: str, total_bytes: int, world: int, channels: int,
               min_part_bytes: int = MIN_PART_BYTES) -> int:
    """How many channels an element-wise collective of ``total_bytes`` runs on: as many as
    give each channel's messages at least ``min_part_bytes`` (a ring AllReduce step carries
    a world-th of its channel's segment, a Broadcast's the segment), at least one."""
    if op not in CHANNELLED:
        return 1
    per_message = total_bytes // world if op == ALLREDUCE else total_bytes
    return max(1, min(channels, per_message // max(1, min_part_bytes)))


class PreparedCollective:
    """``sizes.op`` with ``algorithm`` on this rank of ``executor``'s transport."""

    def __init__(self, executor: Executor, sizes: Sizes, algorithm: str, seed: int,
                 slice_bytes: int = DEFAULT_SLICE_BYTES, root: int = 0,
                 groups: list[list[int]] | None = None):
        self.executor, self.sizes, self.algorithm = executor, sizes, algorithm
        self.seed, self.root = seed, root
        transport = executor.transport
        rank = transport.rank
        self.schedule = build_schedule(sizes.op, algorithm, sizes, root, groups)
        slice_elems = slice_elems_for(slice_bytes, ITEMSIZE)
        channels = min(lane_count(sizes.op, sizes.total_elems * ITEMSIZE, transport.world,
                                  getattr(transport, "channels", 1),
                                  getattr(transport, "min_part_bytes", MIN_PART_BYTES)),
                       sizes.total_elems)
        if channels > 1:
            self.lanes = []
            for c, (start, end) in enumerate(chunk_bounds(sizes.total_elems, channels)):
                part = build_schedule(sizes.op, algorithm, sizes.resized(end - start), root,
                                      groups)
                self.lanes.append((Executor(transport.channel(c)),
                                   plan_rank(shifted(part, start, sizes.total_elems), rank,
                                             slice_elems)))
            self.pool = ThreadPoolExecutor(max_workers=channels,
                                           thread_name_prefix=f"rank{rank}-channel")
        else:
            self.lanes = [(executor, plan_rank(self.schedule, rank, slice_elems))]
            self.pool = None
        self.plan = self.lanes[0][1]
        self.initial = initial_buffers(sizes, rank, seed, root)
        self.buffers = {k: v.copy() for k, v in self.initial.items()}
        self._expected: tuple[int, np.ndarray] | None = None

    @property
    def channels_used(self) -> int:
        """The channels the collective runs on (``lane_count``: fewer than the transport's
        for a small message)."""
        return len(self.lanes)

    @property
    def work(self) -> np.ndarray:
        return self.buffers[WORK]

    def reset(self) -> None:
        """Put the inputs back (a timed loop leaves sums of sums behind)."""
        for k, v in self.initial.items():
            np.copyto(self.buffers[k], v)

    def run(self) -> None:
        work, input_buf = self.buffers[WORK], self.buffers.get(INPUT)
        if self.pool is None:
            self.executor.run(self.plan, work, input_buf)
            return
        futures = [self.pool.submit(executor.run, plan, work, input_buf)
                   for executor, plan in self.lanes]
        for future in futures:
            future.result()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Stop the channels' own executors (the one given is the caller's)."""
        if self.pool is not None:
            for executor, _ in self.lanes:
                executor.close()
            self.pool.shutdown(wait=True)

    def wrong(self) -> int:
        """Elements of the result that differ from the expected values."""
        if self._expected is None:
            self._expected = expected_result(self.sizes, self.executor.transport.rank, self.seed, self.root)
        return count_wrong(self.buffers[WORK], self._expected)
