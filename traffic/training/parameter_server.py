"""Parameter server training (Li et al., OSDI 2014): the parameters are sharded over S
servers; every step each worker pushes its gradient of every shard to that shard's server
and pulls the shard's parameters back, so each server's link sees an N:1 incast per step.

``shard_parameters`` balances the shards by bytes (largest piece first onto the least loaded
server; tensors larger than ``split_bytes`` are cut into pieces first, as key ranges are).
In synchronous mode (BSP) a server adds the gradients of all workers for a step before any
worker gets the parameters back; in asynchronous mode it applies each push as it comes and
answers at once. Parameters start at zero and a step adds the gradients, so the values are
exact sums every rank can check: a BSP worker checks every pull, a server checks its final
parameters in both modes.

Program (``python -m testbed.traffic.training.parameter_server``, every rank): ranks
0..S-1 are servers, the others workers. Each prints per-step times (workers), when each step
was applied (servers), and the bytes sent and received per link end.
"""
from __future__ import annotations

import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from testbed.traffic.collectives.program import RankSession, rank_parser, run_program
from testbed.traffic.collectives.schedule import chunk_bounds
from testbed.traffic.collectives.transport import RecordingTransport
from testbed.traffic.training.compute import add_compute_argument, compute
from testbed.traffic.training.models import MODELS, load_model, scaled_elems

BSP, ASYNC = "bsp", "async"
MIB = 2**20


@dataclass(frozen=True)
class Piece:
    """Bytes [start, end) of parameter ``param``."""

    param: int
    start: int
    end: int

    @property
    def size_bytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Shard:
    server: int
    pieces: tuple[Piece, ...]

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes for p in self.pieces)


def split_pieces(param_bytes: Sequence[int], split_bytes: int | None = None) -> list[Piece]:
    """Every parameter whole, or cut into equal pieces of at most ``split_bytes``."""
    pieces = []
    for i, size in enumerate(param_bytes):
        parts = 1 if not split_bytes else max(1, math.ceil(size / split_bytes))
        pieces += [Piece(i, lo, hi) for lo, hi in chunk_bounds(size, parts)]
    return pieces


def shard_parameters(param_bytes: Sequence[int], servers: int,
                     split_bytes: int | None = None) -> list[Shard]:
    """Longest-processing-time balance: pieces by size, largest first (ties: lower index),
    each onto the server holding the fewest bytes (ties: lower server)."""
    if servers < 1:
        raise ValueError("need at least one server")
    pieces = split_pieces(param_bytes, split_bytes)
    load = [0] * servers
    assigned: list[list[Piece]] = [[] for _ in range(servers)]
    for piece in sorted(pieces, key=lambda p: (-p.size_bytes, p.param, p.start)):
        s = min(range(servers), key=lambda k: (load[k], k))
        assigned[s].append(piece)
        load[s] += piece.size_bytes
    return [Shard(s, tuple(sorted(assigned[s], key=lambda p: (p.param, p.start)))) for s in range(servers)]


def imbalance(shards: list[Shard]) -> float:
    """Largest shard over the mean shard (1 is perfect balance)."""
    sizes = [s.size_bytes for s in shards]
    return max(sizes) / (sum(sizes) / len(sizes)) if sum(sizes) else 1.0


def gradient(worker: int, step: int, server: int, elems: int, seed: int) -> np.ndarray:
    """A worker's gradient of one shard at one step: integers in [-1000, 1000] as float32."""
    rng = np.random.default_rng([seed, worker, step, server])
    return rng.integers(-1000, 1001, size=elems, dtype=np.int32).astype(np.float32)


def step_sum(workers: int, step: int, server: int, elems: int, seed: int) -> np.ndarray:
    total = np.zeros(elems, dtype=np.float32)
    for w in range(workers):
        total += gradient(w, step, server, elems, seed)
    return total


# --- the programs -------------------------------------------------------------------------------


def parse_args(argv):
    ap = rank_parser(__doc__)
    ap.add_argument("--servers", type=int, default=1, help="ranks 0..S-1 are servers")
    ap.add_argument("--mode", choices=(BSP, ASYNC), default=BSP)
    ap.add_argument("--model", choices=MODELS, default="resnet50")
    ap.add_argument("--scale", type=float, default=0.01, help="bytes sent per byte of parameters")
    ap.add_argument("--split-mb", type=float, default=None, help="cut tensors larger than this")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--compute-ms", type=float, default=50.0, help="a worker's compute per step")
    ap.add_argument("--seed", type=int, default=1)
    add_compute_argument(ap)
    return ap.parse_args(argv)


def serve(transport, server: int, workers: int, elems: int, steps: int, mode: str, seed: int) -> dict:
    """One server: a thread per worker receives its pushes and answers with the parameters."""
    params = np.zeros(elems, dtype=np.float32)
    grads = [np.empty(elems, dtype=np.float32) for _ in range(workers)]
    lock = threading.Lock()
    start = time.monotonic()
    applied_s: list[float] = []

    def apply_step():
        for g in grads:
            params[...] += g
        applied_s.append(time.monotonic() - start)

    barrier = threading.Barrier(workers, action=apply_step)

    def serve_worker(j: int) -> None:
        peer = transport.world - workers + j
        for _ in range(steps):
            transport.recv(peer, grads[j])
            if mode == BSP:
                barrier.wait()
                transport.send(peer, params)
            else:
                with lock:
                    params[...] += grads[j]
                    reply = params.copy()
                transport.send(peer, reply)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for f in [pool.submit(serve_worker, j) for j in range(workers)]:
            f.result()
    expected = sum((step_sum(workers, t, server, elems, seed) for t in range(steps)),
                   np.zeros(elems, dtype=np.float32))
    return {"applied_s": applied_s, "wrong": int(np.count_nonzero(params != expected)),
            "serve_s": time.monotonic() - start}


def work(transport, worker: int, servers: int, elems: list[int], steps: int, mode: str, seed: int,
         compute_s: float, compute_mode: str) -> dict:
    """One worker: compute, then push every shard's gradient and pull it back, all servers
    at once."""
    workers = transport.world - servers
    pulled = [np.empty(n, dtype=np.float32) for n in elems]
    expected = [np.zeros(n, dtype=np.float32) for n in elems]
    records, wrong = [], 0
    with ThreadPoolExecutor(max_workers=servers) as pool:
        for t in range(steps):
            t0 = time.monotonic()
            compute(compute_s, compute_mode)
            c0 = time.monotonic()
            grads = [gradient(worker, t, s, n, seed) for s, n in enumerate(elems)]
            for f in [pool.submit(transport.sendrecv, s, grads[s], s, pulled[s]) for s in range(servers)]:
                f.result()
            end = time.monotonic()
            records.append({"step_s": end - t0, "push_pull_s": end - c0})
            if mode == BSP:
                for s, n in enumerate(elems):
                    expected[s] += step_sum(workers, t, s, n, seed)
                    wrong += int(np.count_nonzero(pulled[s] != expected[s]))
    return {"steps": records, "wrong": wrong, "pulls_checked": mode == BSP}


def body(argv) -> dict:
    args = parse_args(argv)
    model = load_model(args.model)
    split = round(args.split_mb * MIB) if args.split_mb else None
    shards = shard_parameters(model.param_bytes(), args.servers, split)
    elems = [scaled_elems(s.size_bytes, args.scale) for s in shards]
    with RankSession(args) as session:
        inner = session.transport
        workers = inner.world - args.servers
        if workers < 1:
            raise ValueError(f"{inner.world} ranks leave no worker beside {args.servers} servers")
        recorder = RecordingTransport(inner, origin_s=0.0)
        inner.barrier()
        timed_start = time.monotonic()
        if args.rank < args.servers:
            role = "server"
            result = serve(recorder, args.rank, workers, elems[args.rank], args.steps, args.mode, args.seed)
        else:
            role = "worker"
            result = work(recorder, args.rank - args.servers, args.servers, elems, args.steps, args.mode,
                          args.seed, args.compute_ms / 1e3, args.compute)
        timed_end = time.monotonic()
        tcp, everyone = session.finish({"role": role, "wrong": result["wrong"],
                                        "steps": result.get("steps", [])})
    out = {"rank": args.rank, "role": role, "mode": args.mode, "servers": args.servers,
           "workers": workers, "model": args.model, "scale": args.scale,
           "shard_bytes": [s.size_bytes for s in shards], "shard_message_bytes": [n * 4 for n in elems],
           "shard_imbalance": imbalance(shards), **result,
           "bytes_per_peer": {str(k): v for k, v in recorder.bytes_per_peer().items()},
           "verified": result["wrong"] == 0,
           "timed_window_monotonic_s": [timed_start, timed_end], **tcp}
    if everyone is not None:
        worker_steps = [r["steps"] for r in everyone if r["role"] == "worker"]
        out["job_step_s"] = [max(w[i]["step_s"] for w in worker_steps) for i in range(args.steps)]
        out["wrong_total"] = sum(r["wrong"] for r in everyone)
        out["verified"] = out["wrong_total"] == 0
    return out


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    sys.exit(main())
