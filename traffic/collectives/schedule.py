"""What a collective is made of, as plain data: per rank and step, the operations it performs.

An operation is a send of an element range to a peer, a receive of an element range from a
peer (added to what is there, ``reduce``, or written over it, ``replace``), or a local copy.
Ranges are [start, end) element offsets into one of a rank's two buffers: ``work`` (where the
result appears) or ``input`` (read-only, for collectives whose input and output differ in
layout, such as AllToAll). Within a step every send and copy reads the buffer as it was before
the step, and receives and copies write after; a step's sends match the peers' receives of the
same step, in order, pair by pair. ``simulate`` runs a schedule in that lockstep on numpy
arrays and is the reference the executor is tested against.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np

WORK, INPUT = "work", "input"
SEND, RECV, COPY = "send", "recv", "copy"
REDUCE, REPLACE = "reduce", "replace"


class ScheduleError(ValueError):
    """A schedule whose sends and receives do not pair up."""


@dataclass(frozen=True)
class Region:
    """Elements [start, end) of one of a rank's buffers."""

    start: int
    end: int
    buffer: str = WORK

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Op:
    """One operation of one rank. ``region`` is read by a send and written by a receive or a
    copy; ``source`` is what a copy reads; ``combine`` says how a write applies."""

    kind: str
    region: Region
    peer: int = -1
    combine: str = REPLACE
    source: Region | None = None


def send(peer: int, start: int, end: int, buffer: str = WORK) -> Op:
    return Op(SEND, Region(start, end, buffer), peer)


def recv(peer: int, start: int, end: int, combine: str = REPLACE) -> Op:
    return Op(RECV, Region(start, end), peer, combine)


def local_copy(source: Region, dest: Region) -> Op:
    return Op(COPY, dest, source=source)


@dataclass(frozen=True)
class Transfer:
    """One matched message: at ``step`` rank ``src`` sends ``src_region`` to rank ``dst``,
    which applies it to ``dst_region`` with ``combine``."""

    step: int
    src: int
    dst: int
    src_region: Region
    dst_region: Region
    combine: str


@dataclass(frozen=True)
class Schedule:
    """A collective for ``world`` ranks: ``steps[rank][t]`` is the tuple of operations rank
    performs at step t. ``work_elems`` and ``input_elems`` size each rank's buffers."""

    name: str
    world: int
    steps: tuple
    work_elems: tuple
    input_elems: tuple

    @property
    def n_steps(self) -> int:
        return len(self.steps[0]) if self.steps else 0

    def transfers(self) -> list[Transfer]:
        """Every message, sends matched to receives step by step and pair by pair.
        Raises ScheduleError when a send has no matching receive or the sizes differ."""
        out = []
        for t in range(self.n_steps):
            outbox: dict[tuple[int, int], deque] = defaultdict(deque)
            for r in range(self.world):
                for op in self.steps[r][t]:
                    if op.kind == SEND:
                        outbox[(r, op.peer)].append(op.region)
            for r in range(self.world):
                for op in self.steps[r][t]:
                    if op.kind != RECV:
                        continue
                    queue = outbox[(op.peer, r)]
                    if not queue:
                        raise ScheduleError(f"{self.name}: step {t}: rank {r} receives from "
                                            f"{op.peer}, which sends it nothing")
                    sent = queue.popleft()
                    if sent.size != op.region.size:
                        raise ScheduleError(f"{self.name}: step {t}: {op.peer}->{r} sends "
                                            f"{sent.size} elements, receives {op.region.size}")
                    out.append(Transfer(t, op.peer, r, sent, op.region, op.combine))
            left = [pair for pair, queue in outbox.items() if queue]
            if left:
                raise ScheduleError(f"{self.name}: step {t}: unreceived sends {sorted(left)}")
        return out


Phase = list  # [rank][step] -> list of Op, filled by the builders in algorithms.py


def new_phase(world: int, n_steps: int) -> Phase:
    return [[[] for _ in range(n_steps)] for _ in range(world)]


def parallel(world: int, *phases: Phase) -> Phase:
    """Phases that run at the same time: step t of the result holds step t of each."""
    n_steps = max((len(p[0]) for p in phases), default=0)
    out = new_phase(world, n_steps)
    for phase in phases:
        for r in range(world):
            for t, ops in enumerate(phase[r]):
                out[r][t].extend(ops)
    return out


def _per_rank(value, world: int) -> tuple:
    """A per-rank tuple from one value for every rank or a list of them."""
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * world


def make_schedule(name: str, world: int, phases: list[Phase], work_elems, input_elems=0) -> Schedule:
    """Phases one after the other; empty phases contribute no steps. ``work_elems`` and
    ``input_elems``: one size for every rank, or one per rank."""
    steps: list[list[tuple]] = [[] for _ in range(world)]
    for phase in phases:
        for r in range(world):
            steps[r].extend(tuple(ops) for ops in phase[r])
    return Schedule(name, world, tuple(tuple(s) for s in steps), _per_rank(work_elems, world),
                    _per_rank(input_elems, world))


def shifted(schedule: Schedule, offset: int, work_elems: int) -> Schedule:
    """The same schedule on elements [offset, offset + its size) of a ``work_elems`` buffer:
    every work region moved by ``offset``. A channel of a collective that runs as several
    independent pipelines (NCCL's channels) is the collective of one segment, shifted."""
    def move(region: Region | None) -> Region | None:
        if region is None or region.buffer != WORK:
            return region
        return Region(region.start + offset, region.end + offset, region.buffer)

    steps = tuple(tuple(tuple(Op(op.kind, move(op.region), op.peer, op.combine, move(op.source))
                              for op in ops) for ops in rank_steps)
                  for rank_steps in schedule.steps)
    return Schedule(schedule.name, schedule.world, steps, (work_elems,) * schedule.world,
                    schedule.input_elems)


def chunk_bounds(n_elems: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) ranges of ``parts`` consecutive chunks; sizes differ by at most one, the
    larger first."""
    base, extra = divmod(n_elems, parts)
    bounds, start = [], 0
    for c in range(parts):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def slice_bounds(start: int, end: int, slice_elems: int) -> list[tuple[int, int]]:
    """Split [start, end) into consecutive slices of at most ``slice_elems`` elements."""
    return [(s, min(s + slice_elems, end)) for s in range(start, end, slice_elems)] or [(start, end)]


def _apply(buffers: dict, region: Region, combine: str, data: np.ndarray) -> None:
    target = buffers[region.buffer][region.start:region.end]
    if combine == REDUCE:
        target += data
    else:
        target[...] = data


def simulate(schedule: Schedule, buffers: list[dict]) -> list[dict]:
    """Run ``schedule`` in lockstep on copies of every rank's buffers ({"work": array,
    "input": array}) and return them. The reference semantics of a schedule."""
    bufs = [{k: v.copy() for k, v in b.items()} for b in buffers]
    by_pair: dict[tuple[int, int, int], deque] = defaultdict(deque)
    for tr in schedule.transfers():
        by_pair[(tr.step, tr.src, tr.dst)].append(tr)
    for t in range(schedule.n_steps):
        writes = []
        for r in range(schedule.world):
            for op in schedule.steps[r][t]:
                if op.kind == COPY:
                    src = op.source
                    writes.append((r, op.region, op.combine, bufs[r][src.buffer][src.start:src.end].copy()))
        for r in range(schedule.world):
            for op in schedule.steps[r][t]:
                if op.kind == RECV:
                    tr = by_pair[(t, op.peer, r)].popleft()
                    src = tr.src_region
                    data = bufs[op.peer][src.buffer][src.start:src.end].copy()
                    writes.append((r, op.region, op.combine, data))
        for r, region, combine, data in writes:
            _apply(bufs[r], region, combine, data)
    return bufs
