"""Run one rank's part of a schedule over a transport, on real numpy buffers.

``plan_rank`` (pure) cuts every operation into slices of at most ``slice_elems`` elements and
gives each slice the slices it must wait for: the last write of every element it reads, and
for a write also every read since (the data hazards of the rank's program, in schedule
order). ``Executor.run`` then gives every peer one sender and one receiver thread, each
walking its slices in schedule order and starting a slice as soon as its dependencies are
done. So a slice received at step t is forwarded at step t+1 while the rest of the chunk is
still arriving, as NCCL pipelines its rings and trees, with no barrier per step. Reduced
slices arrive in a scratch buffer first, so only the addition waits.

Messages between two ranks are matched in order, so each sender and receiver thread must be
the only one using its direction of its peer's connection while a plan runs.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
import threading

import numpy as np

from testbed.traffic.collectives.schedule import (
    COPY,
    INPUT,
    RECV,
    REDUCE,
    SEND,
    WORK,
    Region,
    Schedule,
    slice_bounds,
)

DEFAULT_SLICE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Task:
    """One slice of one operation; ``deps`` are indexes of tasks that must finish first."""

    kind: str
    peer: int
    region: Region
    combine: str
    source: Region | None
    deps: tuple[int, ...]


@dataclass(frozen=True)
class RankPlan:
    """A rank's tasks and the order each thread walks them in."""

    rank: int
    tasks: tuple[Task, ...]
    send_queues: dict
    recv_queues: dict
    local: tuple[int, ...]
    work_elems: int
    input_elems: int
    slice_elems: int


class _Hazards:
    """Per buffer, contiguous segments with the last task that wrote them and the tasks that
    read them since."""

    def __init__(self):
        self.bounds: dict[str, list[int]] = {}
        self.state: dict[str, list[tuple[int | None, list[int]]]] = {}

    def _segments(self, region: Region) -> tuple[list, range]:
        """The buffer's segment states and the indexes of those covering ``region``, split at
        its ends."""
        bounds = self.bounds.setdefault(region.buffer, [0])
        state = self.state.setdefault(region.buffer, [(None, [])])
        for x in (region.start, region.end):
            i = bisect_right(bounds, x) - 1
            if bounds[i] != x:
                bounds.insert(i + 1, x)
                state.insert(i + 1, (state[i][0], list(state[i][1])))
        return state, range(bisect_left(bounds, region.start), bisect_left(bounds, region.end))

    def touch(self, task: int, region: Region, deps: set, write: bool) -> None:
        """Record that ``task`` reads or writes ``region``; add to ``deps`` what it must wait
        for: the last writer, and for a write also every reader since."""
        state, covering = self._segments(region)
        for i in covering:
            writer, readers = state[i]
            if writer is not None:
                deps.add(writer)
            if write:
                deps.update(readers)
                state[i] = (task, [])
            else:
                readers.append(task)


def _sliced(region: Region, slice_elems: int) -> list[Region]:
    return [Region(lo, hi, region.buffer) for lo, hi in slice_bounds(region.start, region.end, slice_elems)]


def plan_rank(schedule: Schedule, rank: int, slice_elems: int) -> RankPlan:
    """Rank's program as slices with dependencies. Within a step, sends and copies read
    before receives write, as the schedule's lockstep semantics say."""
    if slice_elems < 1:
        raise ValueError("slice_elems must be at least 1")
    hazards = _Hazards()
    tasks: list[Task] = []
    send_q: dict[int, list[int]] = {}
    recv_q: dict[int, list[int]] = {}
    local: list[int] = []
    order = {SEND: 0, COPY: 1, RECV: 2}
    for ops in schedule.steps[rank]:
        for op in sorted(ops, key=lambda o: order[o.kind]):
            if op.region.size == 0:
                continue
            sources = _sliced(op.source, slice_elems) if op.source else None
            for j, piece in enumerate(_sliced(op.region, slice_elems)):
                index, deps = len(tasks), set()
                source = sources[j] if sources else None
                if op.kind == SEND:
                    hazards.touch(index, piece, deps, write=False)
                    send_q.setdefault(op.peer, []).append(index)
                else:
                    if source is not None:
                        hazards.touch(index, source, deps, write=False)
                    hazards.touch(index, piece, deps, write=True)
                    (recv_q.setdefault(op.peer, []) if op.kind == RECV else local).append(index)
                tasks.append(Task(op.kind, op.peer, piece, op.combine, source, tuple(sorted(deps))))
    return RankPlan(rank, tuple(tasks), {p: tuple(q) for p, q in send_q.items()},
                    {p: tuple(q) for p, q in recv_q.items()}, tuple(local),
                    schedule.work_elems[rank], schedule.input_elems[rank], slice_elems)


def slice_elems_for(slice_bytes: int, itemsize: int) -> int:
    return max(1, slice_bytes // itemsize)


class _Run:
    """The shared state of one plan running: which tasks are done, and the first failure."""

    def __init__(self, plan: RankPlan, buffers: dict):
        self.plan = plan
        self.buffers = buffers
        self.done = [False] * len(plan.tasks)
        self.cond = threading.Condition()
        self.failure: BaseException | None = None

    def view(self, region: Region) -> np.ndarray:
        return self.buffers[region.buffer][region.start:region.end]

    def wait(self, task: Task) -> None:
        with self.cond:
            while not self.failure and not all(self.done[d] for d in task.deps):
                self.cond.wait()
            if self.failure:
                raise RuntimeError("another slice of this collective failed") from self.failure

    def finish(self, index: int) -> None:
        with self.cond:
            self.done[index] = True
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = exc
            self.cond.notify_all()

    def guarded(self, walk, *args) -> None:
        try:
            walk(*args)
        except BaseException as exc:
            self.fail(exc)
            raise


class Executor:
    """Runs rank plans over ``transport``; its worker threads are reused across runs."""

    def __init__(self, transport):
        self.transport = transport
        self.pool = ThreadPoolExecutor(max_workers=2 * transport.world + 2,
                                       thread_name_prefix=f"rank{transport.rank}")

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run(self, plan: RankPlan, work: np.ndarray, input_buf: np.ndarray | None = None) -> None:
        """Run ``plan`` on ``work`` (and ``input_buf``, read only) in place."""
        short_input = plan.input_elems and (input_buf is None or input_buf.size < plan.input_elems)
        if work.size < plan.work_elems or short_input:
            raise ValueError(f"rank {plan.rank}: buffers smaller than the plan needs")
        run = _Run(plan, {WORK: work, INPUT: input_buf})
        futures = [self.pool.submit(run.guarded, self._send_walk, run, peer, queue)
                   for peer, queue in plan.send_queues.items()]
        futures += [self.pool.submit(run.guarded, self._recv_walk, run, peer, queue)
                    for peer, queue in plan.recv_queues.items()]
        errors = []
        try:
            run.guarded(self._local_walk, run)
        except BaseException as exc:
            errors.append(exc)
        for f in futures:
            exc = f.exception()
            if exc is not None:
                errors.append(exc)
        if errors:
            raise run.failure or errors[0]

    def _send_walk(self, run: _Run, peer: int, queue) -> None:
        for index in queue:
            task = run.plan.tasks[index]
            run.wait(task)
            self.transport.send(peer, run.view(task.region))
            run.finish(index)

    def _recv_walk(self, run: _Run, peer: int, queue) -> None:
        work = run.buffers[WORK]
        scratch = np.empty(run.plan.slice_elems, dtype=work.dtype)
        for index in queue:
            task = run.plan.tasks[index]
            target = run.view(task.region)
            if task.combine == REDUCE:
                incoming = scratch[:target.size]
                self.transport.recv(peer, incoming)
                run.wait(task)
                np.add(target, incoming, out=target)
            else:
                run.wait(task)
                self.transport.recv(peer, target)
            run.finish(index)

    def _local_walk(self, run: _Run) -> None:
        for index in run.plan.local:
            task = run.plan.tasks[index]
            run.wait(task)
            target, data = run.view(task.region), run.view(task.source)
            if task.combine == REDUCE:
                np.add(target, data, out=target)
            else:
                target[...] = data
            run.finish(index)
