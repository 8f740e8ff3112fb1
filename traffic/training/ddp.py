"""Data parallel training as PyTorch DDP runs it: gradient buckets AllReduced while the
backward pass is still computing.

Bucketing (``ddp_buckets``) follows PyTorch's reducer: gradients in the order backward
produces them (reverse registration order, as DDP's rebuilt buckets are after the first
iteration), a bucket closes as soon as it holds at least its limit (so the tensor that
crosses the limit stays in it), the first bucket's limit is 1 MiB
(``_DEFAULT_FIRST_BUCKET_BYTES``) and every later one's 25 MiB (``bucket_cap_mb``).
Backward compute is split over the parameters by parameter count or by FLOPs; a bucket is
ready when its last gradient is, and its AllReduce starts then or when the previous bucket's
ends (one communication stream, as NCCL's). ``overlap_timeline`` predicts the step from
these times and the cost model; the rank program (``python -m testbed.traffic.training.ddp``)
runs it for real over TCP with scaled-down bucket sizes (``--scale``), real float32 data
checked on every rank, and reports step time, communication time and the exposed share
beside the prediction.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Sequence

from testbed.traffic.collectives.cost import predict_s
from testbed.traffic.collectives.data import ALGORITHMS, ALLREDUCE, ITEMSIZE, op_sizes
from testbed.traffic.collectives.executor import Executor
from testbed.traffic.collectives.program import (
    RankSession,
    add_collective_arguments,
    add_cost_arguments,
    cost_links,
    links_json,
    rank_parser,
    report_progress,
    run_program,
)
from testbed.traffic.collectives.runner import PreparedCollective
from testbed.traffic.collectives.transport import RecordingTransport
from testbed.traffic.training.compute import add_compute_argument, wait_until
from testbed.traffic.training.models import MODELS, ModelShapes, load_model, scaled_elems
from testbed.traffic.training.replay import write_rank_events

MIB = 2**20
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
BACKWARD_TO_FORWARD = 2.0  # backward costs about twice the forward FLOPs
SPLITS = ("params", "flops")


@dataclass(frozen=True)
class Bucket:
    """``params``: registration indexes in the order their gradients arrive."""

    index: int
    params: tuple[int, ...]
    size_bytes: int
    limit_bytes: int


def ddp_buckets(param_bytes: Sequence[int], bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
                first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES) -> list[Bucket]:
    """PyTorch's ``compute_bucket_assignment_by_size`` over the gradients in reverse
    registration order, limits [first_bucket_bytes, bucket_cap_bytes, bucket_cap_bytes, ...]."""
    buckets: list[Bucket] = []
    indexes: list[int] = []
    size = 0
    for i in reversed(range(len(param_bytes))):
        limit = first_bucket_bytes if not buckets else bucket_cap_bytes
        indexes.append(i)
        size += param_bytes[i]
        if size >= limit:
            buckets.append(Bucket(len(buckets), tuple(indexes), size, limit))
            indexes, size = [], 0
    if indexes:
        buckets.append(Bucket(len(buckets), tuple(indexes), size,
                              first_bucket_bytes if not buckets else bucket_cap_bytes))
    return buckets


def backward_durations(model: ModelShapes, backward_s: float, split: str = "params") -> list[float]:
    """Each parameter's share of the backward pass (registration order): by its parameter
    count or by its FLOPs."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    weights = [p.numel if split == "params" else p.forward_flops for p in model.params]
    total = sum(weights)
    return [backward_s * w / total for w in weights]


def bucket_ready_s(buckets: list[Bucket], durations: Sequence[float]) -> list[float]:
    """When each bucket's last gradient is ready, in seconds after backward starts; the
    gradients come in reverse registration order."""
    done_at, t = {}, 0.0
    for i in reversed(range(len(durations))):
        t += durations[i]
        done_at[i] = t
    return [max(done_at[i] for i in b.params) for b in buckets]


def flops_compute_s(model: ModelShapes, samples: int, device_gflops: float) -> tuple[float, float]:
    """(forward_s, backward_s) of ``samples`` (images or tokens) on a device doing
    ``device_gflops``; backward is twice the forward."""
    forward_s = model.forward_flops * samples / (device_gflops * 1e9)
    return forward_s, BACKWARD_TO_FORWARD * forward_s


@dataclass(frozen=True)
class BucketTiming:
    index: int
    ready_s: float
    start_s: float
    end_s: float


@dataclass(frozen=True)
class StepTimeline:
    """One step, times from its start: forward, then backward with the buckets' AllReduces
    overlapping it. ``exposed_comm_s``: how long the step ran past the end of backward."""

    forward_s: float
    backward_s: float
    buckets: tuple[BucketTiming, ...]
    step_s: float
    comm_s: float
    exposed_comm_s: float

    @property
    def exposed_share(self) -> float:
        return self.exposed_comm_s / self.step_s if self.step_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "exposed_share": self.exposed_share}


def overlap_timeline(ready_s: Sequence[float], comm_s: Sequence[float], forward_s: float,
                     backward_s: float) -> StepTimeline:
    """Bucket b's AllReduce starts when it is ready (after forward) or when bucket b-1's
    ends, whichever is later, and takes comm_s[b]."""
    timings, free_at = [], forward_s
    for b, (ready, duration) in enumerate(zip(ready_s, comm_s)):
        start = max(forward_s + ready, free_at)
        free_at = start + duration
        timings.append(BucketTiming(b, forward_s + ready, start, free_at))
    compute_end = forward_s + backward_s
    step = max(compute_end, free_at)
    return StepTimeline(forward_s, backward_s, tuple(timings), step, sum(comm_s), step - compute_end)


# --- the rank program ---------------------------------------------------------------------------


def parse_args(argv):
    ap = rank_parser(__doc__)
    ap.add_argument("--model", choices=MODELS, default="resnet50")
    ap.add_argument("--scale", type=float, default=0.01, help="bytes sent per byte of gradient")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--forward-ms", type=float, default=50.0)
    ap.add_argument("--backward-ms", type=float, default=100.0)
    ap.add_argument("--device-gflops", type=float, default=None,
                    help="model compute from FLOPs instead: forward = FLOPs x --samples / rate")
    ap.add_argument("--samples", type=int, default=32, help="images or tokens per step and rank")
    ap.add_argument("--split", choices=SPLITS, default="params",
                    help="how backward time splits over the parameters")
    ap.add_argument("--bucket-cap-mb", type=float, default=DEFAULT_BUCKET_CAP_BYTES / MIB)
    ap.add_argument("--first-bucket-mb", type=float, default=DEFAULT_FIRST_BUCKET_BYTES / MIB)
    add_collective_arguments(ap, ALGORITHMS[ALLREDUCE], "ring", "the buckets' AllReduce algorithm")
    ap.add_argument("--trace-out", default=None,
                    help="write this rank's messages as JSON lines here ({rank} becomes the rank)")
    add_compute_argument(ap)
    add_cost_arguments(ap)
    return ap.parse_args(argv)


def run_step(colls, ready_s, forward_s, backward_s, mode, recorder, step) -> dict:
    """One measured step: forward, backward in a thread that hands each bucket over when it
    is ready, the AllReduces in bucket order on this thread."""
    t0 = time.monotonic()
    wait_until(t0 + forward_s, mode)
    backward_start = time.monotonic()
    ready_q: queue.Queue = queue.Queue()
    backward_end = []

    def backward():
        for b, ready in enumerate(ready_s):
            wait_until(backward_start + ready, mode)
            ready_q.put((b, time.monotonic()))
        wait_until(backward_start + backward_s, mode)
        backward_end.append(time.monotonic())

    thread = threading.Thread(target=backward, daemon=True)
    thread.start()
    buckets = []
    for coll in colls:
        b, ready = ready_q.get()
        start = time.monotonic()
        with recorder.tagged(f"step{step}/bucket{b}"):
            coll.run()
        end = time.monotonic()
        buckets.append(BucketTiming(b, ready - t0, start - t0, end - t0))
    thread.join()
    step_end = time.monotonic()
    comm = sum(x.end_s - x.start_s for x in buckets)
    timeline = StepTimeline(backward_start - t0, backward_end[0] - backward_start, tuple(buckets),
                            step_end - t0, comm, max(0.0, step_end - backward_end[0]))
    return timeline.to_dict()


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def body(argv) -> dict:
    args = parse_args(argv)
    model = load_model(args.model)
    buckets = ddp_buckets(model.param_bytes(), round(args.bucket_cap_mb * MIB),
                          round(args.first_bucket_mb * MIB))
    if args.device_gflops:
        forward_s, backward_s = flops_compute_s(model, args.samples, args.device_gflops)
    else:
        forward_s, backward_s = args.forward_ms / 1e3, args.backward_ms / 1e3
    ready = bucket_ready_s(buckets, backward_durations(model, backward_s, args.split))
    message_bytes = [scaled_elems(b.size_bytes, args.scale) * ITEMSIZE for b in buckets]
    with RankSession(args) as session:
        inner = session.transport
        recorder = RecordingTransport(inner, origin_s=0.0)
        world = inner.world
        link, intra, source = cost_links(args, inner)
        model_comm = [predict_s(ALLREDUCE, args.algo, world, n, link, slice_bytes=args.slice_bytes,
                                groups=args.groups, intra=intra) for n in message_bytes]
        predicted = overlap_timeline(ready, model_comm, forward_s, backward_s)
        steps, wrong = [], 0
        with Executor(recorder) as executor:
            colls = [PreparedCollective(executor, op_sizes(ALLREDUCE, n, world), args.algo,
                                        args.seed + b, args.slice_bytes, groups=args.groups)
                     for b, n in enumerate(message_bytes)]
            try:
                timed_start = None
                for step in range(args.warmup_steps + args.steps):
                    for coll in colls:
                        coll.reset()
                    if step == args.warmup_steps:
                        inner.barrier()
                        timed_start = time.monotonic()
                    result = run_step(colls, ready, forward_s, backward_s, args.compute, recorder, step)
                    wrong += sum(coll.wrong() for coll in colls)
                    if step >= args.warmup_steps:
                        steps.append(result)
                    if args.rank == 0:
                        report_progress(step + 1, args.warmup_steps + args.steps)
                timed_end = time.monotonic()
            finally:
                for coll in colls:
                    coll.close()
        tcp, everyone = session.finish({"step_s": [s["step_s"] for s in steps]})
    if args.trace_out:
        write_rank_events(args.trace_out.format(rank=args.rank), recorder)
    out = {"rank": args.rank, "world": world, "model": args.model, "params": model.total_params,
           "scale": args.scale, "algorithm": args.algo, "channels": args.channels,
           "forward_s": forward_s, "backward_s": backward_s, "split": args.split,
           "buckets": [{"index": b.index, "params": len(b.params), "size_bytes": b.size_bytes,
                        "message_bytes": n} for b, n in zip(buckets, message_bytes)],
           "steps": steps, "mean_step_s": mean(s["step_s"] for s in steps),
           "mean_comm_s": mean(s["comm_s"] for s in steps),
           "mean_exposed_comm_s": mean(s["exposed_comm_s"] for s in steps),
           "exposed_share": mean(s["exposed_share"] for s in steps),
           "predicted": predicted.to_dict(), "cost_model": links_json(link, intra, source),
           "wrong": wrong, "verified": wrong == 0,
           "timed_window_monotonic_s": [timed_start, timed_end], **tcp}
    if everyone is not None:
        per_step = [max(r["step_s"][i] for r in everyone) for i in range(len(steps))]
        out["job_step_s"] = per_step
        out["job_mean_step_s"] = mean(per_step)
    return out


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    sys.exit(main())
