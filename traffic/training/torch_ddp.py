"""A real framework on the fabric: one rank of a torch.distributed (gloo) data-parallel
training of a small model on synthetic data, run inside an emulated host.

Every rank joins the process group at rank 0's fabric address (``tcp://IP:PORT``), with gloo
bound to the host's fabric interface (``--ifname``, set as GLOO_SOCKET_IFNAME), wraps a
multi-layer perceptron in DistributedDataParallel (``--bucket-cap-mb``) and trains it with
SGD on synthetic regression batches (each rank its own, from the seed). Measured:

- the compute alone (forward, backward without gradient synchronisation, the optimizer) on
  this rank, and every step's wall time with DDP (the job's step: the slowest rank);
- verification: DDP's gradient on one batch against the mean of every rank's local gradient
  (elements outside float tolerance are wrong), and the parameters after training identical
  on every rank (SHA-256); the loss before and after;
- beside the step, the generator's prediction for the same parameter shapes: DDP's buckets
  (testbed.traffic.training.ddp.ddp_buckets; every bucket up to the cap, the first too, as
  torch 2.13's DDP rebuilds them when bucket_cap_mb is given), backward
  split over the parameters by size, each bucket's ring AllReduce by the cost model
  (``--link-rate-mbit``/``--alpha-us``), overlapped as DDP does (overlap_timeline), plus the
  optimizer.

Prints one JSON object (rank 0: the job's view); without torch, {"error": "torch is not
installed: ..."} and exit status 1.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys
import time
from datetime import timedelta

from testbed.traffic.collectives.cost import AlphaBeta, link_alpha_beta, predict_s
from testbed.traffic.collectives.data import ALLREDUCE
from testbed.traffic.collectives.program import (
    DEFAULT_PORT,
    add_cost_arguments,
    alpha_beta_json,
    parse_hosts,
    report_progress,
    run_program,
    tcp_counters,
    tcp_delta,
)
from testbed.traffic.training.ddp import (
    MIB,
    backward_durations,
    bucket_ready_s,
    ddp_buckets,
    overlap_timeline,
)
from testbed.traffic.training.models import FP32_BYTES, ModelShapes, Param

TORCH_MISSING = "torch is not installed: scripts/install.sh --extras torch"
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-6  # float32 sums in a different order agree this closely
TIMING_REPEATS = 5
JOIN_TIMEOUT_S = 120.0


def mlp_shapes(input_dim: int, hidden: int, layers: int, outputs: int
               ) -> list[tuple[str, tuple[int, ...]]]:
    """The perceptron's parameters in registration order: ``layers`` hidden Linear layers
    (input -> hidden -> ... -> hidden) and an output layer, each weight then bias, named as
    torch.nn.Sequential names them."""
    dims = [input_dim] + [hidden] * layers + [outputs]
    shapes = []
    for i, (n_in, n_out) in enumerate(zip(dims, dims[1:])):
        index = 2 * i  # Linear, ReLU, Linear, ReLU, ..., Linear
        shapes += [(f"{index}.weight", (n_out, n_in)), (f"{index}.bias", (n_out,))]
    return shapes


def model_shapes(shapes: list[tuple[str, tuple[int, ...]]]) -> ModelShapes:
    """The parameter shapes as the generator's model description (no FLOPs: backward is
    split over the parameters by size)."""
    return ModelShapes("torch-mlp", tuple(Param(name, shape, 0) for name, shape in shapes),
                       "torch.nn.Sequential of Linear and ReLU")


def predict_step(shapes: ModelShapes, world: int, link: AlphaBeta, bucket_cap_bytes: int,
                 forward_s: float, backward_s: float, optimizer_s: float) -> dict:
    """The step the generator predicts for these shapes: DDP's buckets (an explicit cap
    applies to the first bucket too: DDP's smaller first bucket comes only with its default
    cap), each ready when its last gradient is (backward split by parameter count), ring
    AllReduced one after the other as soon as ready, then the optimizer."""
    buckets = ddp_buckets(shapes.param_bytes(), bucket_cap_bytes, bucket_cap_bytes)
    ready = bucket_ready_s(buckets, backward_durations(shapes, backward_s, "params"))
    comm = [predict_s(ALLREDUCE, "ring", world, b.size_bytes, link) for b in buckets]
    timeline = overlap_timeline(ready, comm, forward_s, backward_s)
    return {**timeline.to_dict(), "optimizer_s": optimizer_s,
            "predicted_step_s": timeline.step_s + optimizer_s,
            "bucket_bytes": [b.size_bytes for b in buckets]}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--hosts", required=True, help="every rank's ip in rank order (rank 0 hosts "
                                                   "the rendezvous)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="rank 0's rendezvous port")
    ap.add_argument("--ifname", default=None, help="the fabric interface gloo uses "
                                                   "(GLOO_SOCKET_IFNAME)")
    ap.add_argument("--input-dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2, help="hidden layers")
    ap.add_argument("--outputs", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=JOIN_TIMEOUT_S)
    add_cost_arguments(ap)
    return ap.parse_args(argv)


def param_digest(model) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def body(argv) -> dict:
    args = parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return {"error": TORCH_MISSING, "verified": False}
    if args.ifname:
        os.environ[GLOO_IFNAME] = args.ifname
    torch.set_num_threads(args.threads)
    addresses = parse_hosts(args.hosts, args.port)
    world = len(addresses)
    ip0, _ = addresses[0]
    tcp_start = tcp_counters()
    dist.init_process_group("gloo", init_method=f"tcp://{ip0}:{args.port}", rank=args.rank,
                            world_size=world, timeout=timedelta(seconds=args.timeout_s))
    try:
        out = train(args, torch, dist, DistributedDataParallel, world, tcp_start)
        gc.collect()  # the DDP wrapper's reducer goes now, while its group is still alive
        dist.barrier()  # no rank tears the group down while another still uses it
        return out
    finally:
        dist.destroy_process_group()


def train(args, torch, dist, DistributedDataParallel, world: int, tcp_start: dict) -> dict:
    shapes = mlp_shapes(args.input_dim, args.hidden, args.layers, args.outputs)
    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    layers = []
    for i, (name, shape) in enumerate(shapes[::2]):
        layers.append(torch.nn.Linear(shape[1], shape[0]))
        if 2 * i + 2 < len(shapes):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    registered = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    if registered != shapes:
        raise RuntimeError(f"the model's parameters {registered} are not {shapes}")
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = torch.nn.MSELoss()
    target = torch.Generator().manual_seed(args.seed)
    truth = torch.randn(args.input_dim, args.outputs, generator=target) / args.input_dim ** 0.5

    def batch(step: int, rank: int = args.rank):
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + rank * 10_007 + step + 1)
        x = torch.randn(args.batch, args.input_dim, generator=gen)
        return x, x @ truth

    held_out = batch(-2, rank=world)  # the same on every rank, never trained on

    def held_out_loss() -> float:
        with torch.no_grad():
            return float(loss_fn(model(held_out[0]), held_out[1]))

    # compute alone: forward, backward without synchronisation (median of a few)
    forward, backward = [], []
    x, y = batch(-1)
    for _ in range(TIMING_REPEATS):
        with ddp.no_sync():
            t0 = time.monotonic()
            loss = loss_fn(ddp(x), y)
            t1 = time.monotonic()
            loss.backward()
            t2 = time.monotonic()
        forward.append(t1 - t0)
        backward.append(t2 - t1)
        optimizer.zero_grad(set_to_none=True)

    # DDP's averaged gradient against the mean of every rank's local one
    with ddp.no_sync():
        loss_fn(ddp(x), y).backward()
    local = torch.cat([p.grad.detach().flatten().clone() for p in model.parameters()])
    optimizer.zero_grad(set_to_none=True)
    loss_fn(ddp(x), y).backward()
    synced = torch.cat([p.grad.detach().flatten().clone() for p in model.parameters()])
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(local)
    local /= world
    grad_wrong = int((~torch.isclose(synced, local, rtol=GRAD_RTOL, atol=GRAD_ATOL)).sum())

    loss_before = held_out_loss()
    steps, optimizer_s = [], []
    timed_start = None
    for step in range(args.warmup_steps + args.steps):
        x, y = batch(step)
        dist.barrier()
        t0 = time.monotonic()
        if step == args.warmup_steps:
            timed_start = t0
        loss = loss_fn(ddp(x), y)
        loss.backward()
        t1 = time.monotonic()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t2 = time.monotonic()
        if step >= args.warmup_steps:
            steps.append(t2 - t0)
            optimizer_s.append(t2 - t1)
        if args.rank == 0:
            report_progress(step + 1, args.warmup_steps + args.steps)
    timed_end = time.monotonic()
    loss_after = held_out_loss()
    tcp = tcp_delta(tcp_start, tcp_counters())
    mine = {"rank": args.rank, "step_s": steps, "grad_wrong": grad_wrong,
            "digest": param_digest(model), **tcp}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    forward_s, backward_s = sorted(forward)[len(forward) // 2], sorted(backward)[len(backward) // 2]
    out = {**mine, "world": world, "params": sum(p.numel() for p in model.parameters()),
           "param_bytes": sum(p.numel() for p in model.parameters()) * FP32_BYTES,
           "shapes": [[n, list(s)] for n, s in shapes], "bucket_cap_mb": args.bucket_cap_mb,
           "forward_s": forward_s, "backward_s": backward_s,
           "optimizer_s": sum(optimizer_s) / len(optimizer_s) if optimizer_s else 0.0,
           "loss_before": loss_before, "loss_after": loss_after,
           "timed_window_monotonic_s": [timed_start, timed_end],
           "verified": grad_wrong == 0}
    if args.rank != 0:
        return out
    job = [max(r["step_s"][i] for r in everyone) for i in range(len(steps))]
    identical = len({r["digest"] for r in everyone}) == 1
    wrong_total = sum(r["grad_wrong"] for r in everyone)
    out.update({"job_step_s": job, "mean_step_s": sum(job) / len(job) if job else 0.0,
                "grad_wrong_total": wrong_total, "params_identical": identical,
                "tcp_out_segs_total": sum(r["tcp_out_segs"] for r in everyone),
                "tcp_retrans_segs_total": sum(r["tcp_retrans_segs"] for r in everyone),
                "verified": identical and wrong_total == 0})
    if args.link_rate_mbit is not None:
        link = link_alpha_beta(args.link_rate_mbit, host_latency_s=(args.alpha_us or 0.0) * 1e-6)
        out["predicted"] = predict_step(model_shapes(shapes), world, link,
                                        round(args.bucket_cap_mb * MIB), forward_s, backward_s,
                                        out["optimizer_s"])
        out["cost_model"] = {"source": "arguments", "link": alpha_beta_json(link)}
    else:
        out["predicted"] = None
        out["cost_model"] = {"source": "none: no --link-rate-mbit given"}
    return out


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    code = main()
    # The result is printed; leave without the interpreter's finalisation, in which torch's
    # C++ objects (gloo's threads) are destroyed in no fixed order and can abort a rank that
    # finished ("terminate called without an active exception", exit -6, seen in CI).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
