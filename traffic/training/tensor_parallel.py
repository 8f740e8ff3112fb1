"""Tensor parallelism as Megatron-LM runs it (Shoeybi et al. 2019): every transformer layer
splits its attention and MLP across the ranks of the tensor-parallel group, which then
AllReduce the activations (batch x sequence x hidden) twice in the forward pass (after
attention, after the MLP) and twice in the backward pass (the input gradients of both), with
nothing overlapping them. That puts 4 AllReduces per layer on the critical path, which is
why TP stays inside an NVLink domain.

``tp_collectives`` lists a step's AllReduces in order; ``predict_tp_step_s`` adds compute and
the cost model's AllReduce time. The rank program (``python -m
testbed.traffic.training.tensor_parallel``) runs the step over TCP with scaled activation
sizes, real float32 data checked on every rank, and modelled compute between the AllReduces.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

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
from testbed.traffic.training.compute import add_compute_argument, compute
from testbed.traffic.training.models import scaled_elems

FORWARD, BACKWARD = "forward", "backward"
ATTENTION, MLP = "attention", "mlp"
GPT2_SMALL = {"layers": 12, "hidden": 768, "seq": 1024}


def activation_bytes(batch: int, seq: int, hidden: int, bytes_per_elem: int = 2) -> int:
    """One AllReduce's size: the layer's activations (or their gradients)."""
    return batch * seq * hidden * bytes_per_elem


@dataclass(frozen=True)
class TpCollective:
    layer: int
    phase: str
    block: str
    size_bytes: int


def tp_collectives(layers: int, size_bytes: int) -> list[TpCollective]:
    """A step's AllReduces in order: forward layer by layer (attention, then MLP), backward
    from the last layer (MLP, then attention)."""
    forward = [TpCollective(layer, FORWARD, block, size_bytes)
               for layer in range(layers) for block in (ATTENTION, MLP)]
    backward = [TpCollective(layer, BACKWARD, block, size_bytes)
                for layer in reversed(range(layers)) for block in (MLP, ATTENTION)]
    return forward + backward


def predict_tp_step_s(layers: int, layer_forward_s: float, layer_backward_s: float,
                      allreduce_s: float) -> float:
    """Compute of every layer plus 4 AllReduces per layer, none overlapped."""
    return layers * (layer_forward_s + layer_backward_s) + 4 * layers * allreduce_s


def parse_args(argv):
    ap = rank_parser(__doc__)
    ap.add_argument("--layers", type=int, default=GPT2_SMALL["layers"])
    ap.add_argument("--hidden", type=int, default=GPT2_SMALL["hidden"])
    ap.add_argument("--seq", type=int, default=GPT2_SMALL["seq"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bytes-per-elem", type=int, default=2, help="2 for fp16/bf16 activations")
    ap.add_argument("--scale", type=float, default=0.01, help="bytes sent per byte of activation")
    ap.add_argument("--layer-forward-ms", type=float, default=4.0)
    ap.add_argument("--layer-backward-ms", type=float, default=8.0)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=1)
    add_collective_arguments(ap, ALGORITHMS[ALLREDUCE], "ring", "the activations' AllReduce algorithm")
    add_compute_argument(ap)
    add_cost_arguments(ap)
    return ap.parse_args(argv)


def body(argv) -> dict:
    args = parse_args(argv)
    act_bytes = activation_bytes(args.batch, args.seq, args.hidden, args.bytes_per_elem)
    message_bytes = scaled_elems(act_bytes, args.scale) * ITEMSIZE
    plan = tp_collectives(args.layers, message_bytes)
    half_forward_s, half_backward_s = args.layer_forward_ms / 2e3, args.layer_backward_ms / 2e3
    with RankSession(args) as session:
        transport = session.transport
        world = transport.world
        link, intra, source = cost_links(args, transport)
        allreduce_s = predict_s(ALLREDUCE, args.algo, world, message_bytes, link, slice_bytes=args.slice_bytes,
                                groups=args.groups, intra=intra)
        predicted = predict_tp_step_s(args.layers, 2 * half_forward_s, 2 * half_backward_s, allreduce_s)
        steps, wrong = [], 0
        with Executor(transport) as executor:
            sizes = op_sizes(ALLREDUCE, message_bytes, world)
            colls = [PreparedCollective(executor, sizes, args.algo, args.seed + i, args.slice_bytes,
                                        groups=args.groups)
                     for i in range(len(plan))]
            timed_start = None
            try:
                for step in range(args.warmup_steps + args.steps):
                    for coll in colls:
                        coll.reset()
                    transport.barrier()
                    t0 = time.monotonic()
                    if step == args.warmup_steps:
                        timed_start = t0
                    comm_s = 0.0
                    for entry, coll in zip(plan, colls):
                        compute(half_forward_s if entry.phase == FORWARD else half_backward_s, args.compute)
                        start = time.monotonic()
                        coll.run()
                        comm_s += time.monotonic() - start
                    step_s = time.monotonic() - t0
                    wrong += sum(coll.wrong() for coll in colls)
                    if step >= args.warmup_steps:
                        steps.append({"step_s": step_s, "comm_s": comm_s, "compute_s": step_s - comm_s})
                    if args.rank == 0:
                        report_progress(step + 1, args.warmup_steps + args.steps)
            finally:
                for coll in colls:
                    coll.close()
            timed_end = time.monotonic()
        tcp, everyone = session.finish({"step_s": [s["step_s"] for s in steps]})
    n = max(len(steps), 1)
    out = {"rank": args.rank, "world": world, "layers": args.layers, "activation_bytes": act_bytes,
           "message_bytes": message_bytes, "allreduces_per_step": len(plan), "algorithm": args.algo,
           "steps": steps, "mean_step_s": sum(s["step_s"] for s in steps) / n,
           "mean_comm_s": sum(s["comm_s"] for s in steps) / n,
           "predicted_step_s": predicted, "predicted_allreduce_s": allreduce_s,
           "cost_model": links_json(link, intra, source), "wrong": wrong, "verified": wrong == 0,
           "timed_window_monotonic_s": [timed_start, timed_end], **tcp}
    if everyone is not None:
        out["job_step_s"] = [max(r["step_s"][i] for r in everyone) for i in range(len(steps))]
    return out


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    sys.exit(main())
