"""Pipeline parallelism: GPipe and 1F1B schedules as plain data, their timing, and a stage
program that runs them between emulated hosts.

A schedule gives every stage its ordered list of forward (F) and backward (B) operations,
each on one micro-batch. GPipe (Huang et al. 2019) runs all m forwards, then all backwards:
every stage holds m micro-batches' activations. 1F1B (PipeDream-Flush; Narayanan et al.
2021) lets stage s run p-s-1 warm-up forwards, then alternates one forward and one backward,
then drains: at most p-s in flight. Both leave the same bubble, (p-1)/(m+p-1) of the time
(forward and backward each one slot per micro-batch and stage).

``simulate_pipeline`` times a schedule with given compute and transfer times (pure);
``run_stage`` runs one stage over a transport: it receives the activation of a micro-batch
from the previous stage before its F and the gradient from the next stage before its B,
models the compute, and hands what it produces to a sender thread per direction (so a stage
never blocks on a send, as Megatron's batched isend/irecv), recording each operation's start
and end (time.monotonic, shared by every host of the machine). Activations carry real bytes:
stage s forwards micro-batch i's input plus s, and sends back minus the input minus s, and
every receiver checks what it got. Program: ``python -m testbed.traffic.training.pipeline``
in every rank (rank = stage); rank 0 gathers the records, measures the bubble and the
micro-batches in flight, and can draw the Gantt chart (--gantt out.png).
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from testbed.traffic.collectives.data import rank_data
from testbed.traffic.collectives.program import (
    RankSession,
    parse_size,
    rank_parser,
    report_progress,
    run_program,
)
from testbed.traffic.collectives.transport import Transport
from testbed.traffic.training.compute import add_compute_argument, compute
from testbed.traffic.training.gantt import plot_gantt

F, B = "F", "B"


@dataclass(frozen=True)
class PipeOp:
    kind: str
    micro_batch: int


def gpipe_schedule(stages: int, micro_batches: int) -> list[list[PipeOp]]:
    """All forwards, then all backwards, on every stage."""
    _check(stages, micro_batches)
    one = [PipeOp(F, i) for i in range(micro_batches)] + [PipeOp(B, i) for i in range(micro_batches)]
    return [list(one) for _ in range(stages)]


def one_f_one_b_schedule(stages: int, micro_batches: int) -> list[list[PipeOp]]:
    """Warm-up forwards (p-s-1 on stage s), one forward one backward, then the remaining
    backwards."""
    _check(stages, micro_batches)
    out = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro_batches)
        ops = [PipeOp(F, i) for i in range(warmup)]
        for i in range(micro_batches - warmup):
            ops += [PipeOp(F, warmup + i), PipeOp(B, i)]
        ops += [PipeOp(B, i) for i in range(micro_batches - warmup, micro_batches)]
        out.append(ops)
    return out


SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


def _check(stages: int, micro_batches: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"need at least one stage and one micro-batch, not {stages} and {micro_batches}")


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of a pipeline flush: (p-1)/(m+p-1)."""
    return (stages - 1) / (micro_batches + stages - 1)


def in_flight(ops: list[PipeOp]) -> list[int]:
    """Micro-batches whose forward has run and whose backward has not, after each op."""
    counts, n = [], 0
    for op in ops:
        n += 1 if op.kind == F else -1
        counts.append(n)
    return counts


def peak_in_flight(ops: list[PipeOp]) -> int:
    return max(in_flight(ops), default=0)


@dataclass(frozen=True)
class OpRecord:
    stage: int
    kind: str
    micro_batch: int
    start_s: float
    end_s: float


def dependency(op: PipeOp, stage: int, stages: int) -> tuple[int, str, int] | None:
    """The other stage's operation this one needs: the previous stage's F of the same
    micro-batch, or the next stage's B."""
    if op.kind == F and stage > 0:
        return stage - 1, F, op.micro_batch
    if op.kind == B and stage < stages - 1:
        return stage + 1, B, op.micro_batch
    return None


def simulate_pipeline(schedule: list[list[PipeOp]], forward_s: float, backward_s: float,
                      comm_s: float = 0.0) -> list[OpRecord]:
    """Every operation's start and end when each stage runs its list in order, an operation
    starting once its stage is free and its input has arrived (``comm_s`` after the producing
    operation ended)."""
    stages = len(schedule)
    done: dict[tuple[int, str, int], float] = {}
    pos, free_at, records = [0] * stages, [0.0] * stages, []
    while any(pos[s] < len(schedule[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while pos[s] < len(schedule[s]):
                op = schedule[s][pos[s]]
                dep = dependency(op, s, stages)
                if dep is not None and dep not in done:
                    break
                start = max(free_at[s], done[dep] + comm_s if dep is not None else 0.0)
                end = start + (forward_s if op.kind == F else backward_s)
                done[(s, op.kind, op.micro_batch)] = free_at[s] = end
                records.append(OpRecord(s, op.kind, op.micro_batch, start, end))
                pos[s] += 1
                progressed = True
        if not progressed:
            raise ValueError("the schedule deadlocks: a stage waits for an operation never run")
    return records


def measured_bubble(records: list[OpRecord], stages: int) -> float:
    """1 - busy time / (stages x makespan), from the first start to the last end."""
    if not records:
        return 0.0
    makespan = max(r.end_s for r in records) - min(r.start_s for r in records)
    busy = sum(r.end_s - r.start_s for r in records)
    return 1 - busy / (stages * makespan) if makespan > 0 else 0.0


# --- one stage over a transport -----------------------------------------------------------------


class _Sender:
    """Sends queued buffers to one peer from its own thread."""

    def __init__(self, transport: Transport, peer: int):
        self.transport, self.peer = transport, peer
        self.queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._walk, daemon=True)
        self.thread.start()

    def _walk(self) -> None:
        while (buf := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.transport.send(self.peer, buf)
                except BaseException as exc:
                    self.error = exc

    def put(self, buf: np.ndarray) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(buf)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def activation(micro_batch: int, elems: int, seed: int) -> np.ndarray:
    return rank_data(micro_batch, elems, seed)


def run_stage(transport: Transport, ops: list[PipeOp], forward_s: float, backward_s: float,
              elems: int, seed: int, mode: str = "sleep") -> tuple[list[OpRecord], int]:
    """Run stage ``transport.rank`` of a pipeline of ``transport.world`` stages. Returns the
    op records (absolute monotonic times) and the number of wrong elements received."""
    stage, stages = transport.rank, transport.world
    inputs = {op.micro_batch: activation(op.micro_batch, elems, seed) for op in ops}
    to_next = _Sender(transport, stage + 1) if stage < stages - 1 else None
    to_prev = _Sender(transport, stage - 1) if stage > 0 else None
    records, wrong = [], 0
    incoming = np.empty(elems, dtype=np.float32)
    try:
        for op in ops:
            base = inputs[op.micro_batch]
            if op.kind == F and to_prev is not None:
                transport.recv(stage - 1, incoming)
                wrong += int(np.count_nonzero(incoming != base + (stage - 1)))
            elif op.kind == B and to_next is not None:
                transport.recv(stage + 1, incoming)
                wrong += int(np.count_nonzero(incoming != -base - (stage + 1)))
            start = time.monotonic()
            compute(forward_s if op.kind == F else backward_s, mode)
            end = time.monotonic()
            records.append(OpRecord(stage, op.kind, op.micro_batch, start, end))
            if op.kind == F and to_next is not None:
                to_next.put(base + stage)
            elif op.kind == B and to_prev is not None:
                to_prev.put(-base - stage)
    finally:
        for sender in (to_next, to_prev):
            if sender is not None:
                sender.close()
    return records, wrong


def parse_args(argv):
    ap = rank_parser(__doc__)
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--activation-bytes", type=parse_size, default=parse_size("256K"),
                    help="bytes of one micro-batch's activation (and of its gradient)")
    ap.add_argument("--forward-ms", type=float, default=20.0)
    ap.add_argument("--backward-ms", type=float, default=40.0)
    ap.add_argument("--steps", type=int, default=1, help="pipeline flushes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gantt", default=None, help="rank 0 draws the last step's Gantt chart here (PNG)")
    add_compute_argument(ap)
    return ap.parse_args(argv)


def body(argv) -> dict:
    args = parse_args(argv)
    elems = max(1, args.activation_bytes // 4)
    forward_s, backward_s = args.forward_ms / 1e3, args.backward_ms / 1e3
    with RankSession(args) as session:
        transport = session.transport
        stages = transport.world
        schedule = SCHEDULES[args.schedule](stages, args.micro_batches)
        ops = schedule[transport.rank]
        steps, wrong = [], 0
        timed_start = time.monotonic()
        for _ in range(args.steps):
            transport.barrier()
            records, bad = run_stage(transport, ops, forward_s, backward_s, elems, args.seed, args.compute)
            wrong += bad
            steps.append([asdict(r) for r in records])
            if args.rank == 0:
                report_progress(len(steps), args.steps)
        timed_end = time.monotonic()
        tcp, everyone = session.finish({"steps": steps})
    out = {"rank": args.rank, "stage": args.rank, "schedule": args.schedule, "stages": stages,
           "micro_batches": args.micro_batches, "activation_bytes": elems * 4,
           "peak_in_flight": peak_in_flight(ops), "wrong": wrong, "verified": wrong == 0,
           "timed_window_monotonic_s": [timed_start, timed_end], **tcp}
    if everyone is None:
        return out
    predicted = simulate_pipeline(schedule, forward_s, backward_s)
    per_step = []
    for i in range(args.steps):
        records = [OpRecord(**r) for rank in everyone for r in rank["steps"][i]]
        makespan = max(r.end_s for r in records) - min(r.start_s for r in records)
        per_step.append({"makespan_s": makespan, "bubble": measured_bubble(records, stages)})
    out.update({
        "steps": per_step,
        "bubble_measured": sum(s["bubble"] for s in per_step) / len(per_step),
        "bubble_theory": bubble_fraction(stages, args.micro_batches),
        "makespan_predicted_s": max(r.end_s for r in predicted),
        "peak_in_flight_per_stage": [peak_in_flight(s) for s in schedule],
        "records": [r for rank in everyone for r in rank["steps"][-1]],
    })
    if args.gantt:
        plot_gantt([OpRecord(**r) for r in out["records"]], args.gantt,
                   f"{args.schedule}: {stages} stages, {args.micro_batches} micro-batches, "
                   f"bubble {out['bubble_measured']:.3f} (theory {out['bubble_theory']:.3f})")
        out["gantt"] = args.gantt
    return out


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    sys.exit(main())
