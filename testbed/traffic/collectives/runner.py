"""A collective made ready to run on one rank: its schedule compiled into this rank's plan,
its input built from the seed, and its result checked against the expected values.
Programs time ``run`` and count ``wrong`` after a fresh ``reset``."""
from __future__ import annotations

import numpy as np

from testbed.traffic.collectives.data import (
    ITEMSIZE,
    Sizes,
    build_schedule,
    count_wrong,
    expected_result,
    initial_buffers,
)
from testbed.traffic.collectives.executor import DEFAULT_SLICE_BYTES, Executor, plan_rank, slice_elems_for
from testbed.traffic.collectives.schedule import INPUT, WORK


class PreparedCollective:
    """``sizes.op`` with ``algorithm`` on this rank of ``executor``'s transport."""

    def __init__(self, executor: Executor, sizes: Sizes, algorithm: str, seed: int,
                 slice_bytes: int = DEFAULT_SLICE_BYTES, root: int = 0,
                 groups: list[list[int]] | None = None):
        self.executor, self.sizes, self.algorithm = executor, sizes, algorithm
        self.seed, self.root = seed, root
        rank = executor.transport.rank
        self.schedule = build_schedule(sizes.op, algorithm, sizes, root, groups)
        self.plan = plan_rank(self.schedule, rank, slice_elems_for(slice_bytes, ITEMSIZE))
        self.initial = initial_buffers(sizes, rank, seed, root)
        self.buffers = {k: v.copy() for k, v in self.initial.items()}
        self._expected: tuple[int, np.ndarray] | None = None

    @property
    def work(self) -> np.ndarray:
        return self.buffers[WORK]

    def reset(self) -> None:
        """Put the inputs back (a timed loop leaves sums of sums behind)."""
        for k, v in self.initial.items():
            np.copyto(self.buffers[k], v)

    def run(self) -> None:
        self.executor.run(self.plan, self.buffers[WORK], self.buffers.get(INPUT))

    def wrong(self) -> int:
        """Elements of the result that differ from the expected values."""
        if self._expected is None:
            self._expected = expected_result(self.sizes, self.executor.transport.rank, self.seed, self.root)
        return count_wrong(self.buffers[WORK], self._expected)
