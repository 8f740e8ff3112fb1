"""One rank of a ring AllReduce over TCP, run inside an emulated host.

Each rank listens for its predecessor, connects to its successor, builds its own input from
(seed, rank), runs warm-up and timed iterations, and checks the result against the expected
sum's SHA-256 given by the orchestrator. A sender and a receiver thread stream slices through
the ring: slice j of step t is sent as soon as slice j of step t-1 has arrived (and been
reduced), as NCCL pipelines its ring. Prints one JSON line with the timings and the verdict.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import socket
import sys
import threading
import time

import numpy as np

from testbed.traffic.ring import (
    COPY,
    chunk_bounds,
    rank_data,
    ring_schedule,
    slice_bounds,
)

CONNECT_TIMEOUT_S = 60.0
IO_TIMEOUT_S = 300.0


def connect_ring(rank: int, next_ip: str, port: int, channels: int) -> list[tuple[socket.socket, socket.socket]]:
    """One (to_next, from_prev) TCP connection pair per channel, channel c on port + c.

    Channels are separate connections (distinct five-tuples, as NCCL's channels are), so
    ECMP can hash them onto different paths."""
    listeners = []
    for c in range(channels):
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("0.0.0.0", port + c))
        ls.listen(1)
        ls.settimeout(CONNECT_TIMEOUT_S)
        listeners.append(ls)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    outgoing = []
    for c in range(channels):
        while True:
            try:
                outgoing.append(socket.create_connection((next_ip, port + c), timeout=2.0))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {rank}: cannot reach successor {next_ip}:{port + c}")
                time.sleep(0.05)
    pairs = []
    for c, ls in enumerate(listeners):
        incoming, _ = ls.accept()
        ls.close()
        for s in (outgoing[c], incoming):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(IO_TIMEOUT_S)
        pairs.append((outgoing[c], incoming))
    return pairs


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("predecessor closed the connection")
        view = view[n:]


def tcp_counters() -> dict[str, int]:
    """This namespace's TCP counters (OutSegs, RetransSegs, ...) from /proc/net/snmp."""
    with open("/proc/net/snmp") as fh:
        rows = [line.split() for line in fh if line.startswith("Tcp:")]
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:])}


def barrier(rank: int, to_next: socket.socket, from_prev: socket.socket) -> None:
    """A token goes twice around the ring: afterwards every rank has passed the barrier."""
    token = bytearray(1)
    for _ in range(2):
        if rank == 0:
            to_next.sendall(b"\x01")
            recv_exact(from_prev, memoryview(token))
        else:
            recv_exact(from_prev, memoryview(token))
            to_next.sendall(b"\x01")


def allreduce(buf: np.ndarray, rank: int, world: int, to_next, from_prev, slice_elems: int) -> None:
    """In-place ring AllReduce (sum) of ``buf``."""
    chunks = chunk_bounds(buf.size, world)
    steps = ring_schedule(rank, world)
    plan = [(step, slice_bounds(*chunks[step.send_chunk], slice_elems),
             slice_bounds(*chunks[step.recv_chunk], slice_elems)) for step in steps]
    done = 0  # slices received and applied, counted over the whole schedule
    cond = threading.Condition()
    error: list[BaseException] = []

    def receiver():
        nonlocal done
        scratch = np.empty(slice_elems, dtype=buf.dtype)
        try:
            for step, _, recv_slices in plan:
                for lo, hi in recv_slices:
                    if step.op == COPY:
                        recv_exact(from_prev, memoryview(buf[lo:hi]).cast("B"))
                    else:
                        tmp = scratch[: hi - lo]
                        recv_exact(from_prev, memoryview(tmp).cast("B"))
                        np.add(buf[lo:hi], tmp, out=buf[lo:hi])
                    with cond:
                        done += 1
                        cond.notify_all()
        except BaseException as exc:  # surfaced to the main thread below
            error.append(exc)
            with cond:
                cond.notify_all()

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    # recv_offset[t]: slices received before step t; the slices sent at step t are the ones
    # received at step t-1, so slice j may go once slice recv_offset[t-1] + j has arrived.
    recv_offset = list(itertools.accumulate((len(p[2]) for p in plan), initial=0))
    for t, (_, send_slices, _) in enumerate(plan):
        for j, (lo, hi) in enumerate(send_slices):
            if t > 0:
                with cond:
                    while done < recv_offset[t - 1] + j + 1 and not error:
                        cond.wait()
                if error:
                    raise error[0]
            to_next.sendall(memoryview(buf[lo:hi]).cast("B"))
    thread.join()
    if error:
        raise error[0]


def allreduce_channels(buf: np.ndarray, rank: int, world: int, pairs, slice_elems: int) -> None:
    """Split ``buf`` into one segment per channel and reduce the segments concurrently."""
    segments = [buf[lo:hi] for lo, hi in chunk_bounds(buf.size, len(pairs))]
    errors: list[BaseException] = []

    def run(seg, pair):
        try:
            allreduce(seg, rank, world, pair[0], pair[1], slice_elems)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(seg, pair)) for seg, pair in zip(segments, pairs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--next-ip", required=True)
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--size-bytes", type=int, required=True, help="AllReduce size S (float32)")
    ap.add_argument("--channels", type=int, default=4, help="parallel rings (connections)")
    ap.add_argument("--slice-bytes", type=int, default=256 * 1024)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--expect-sha256", required=True, help="digest of the expected sum")
    args = ap.parse_args(argv)

    n_elems = args.size_bytes // 4
    slice_elems = max(1, args.slice_bytes // 4)
    tcp_start = tcp_counters()
    pairs = connect_ring(args.rank, args.next_ip, args.port, args.channels)
    to_next, from_prev = pairs[0]
    source = rank_data(args.rank, n_elems, args.seed)
    times_s, verified, timed_start = [], True, None
    for it in range(args.warmup + args.iters):
        buf = source.copy()
        barrier(args.rank, to_next, from_prev)
        t0 = time.monotonic()
        if it == args.warmup:
            timed_start = t0
        allreduce_channels(buf, args.rank, args.world, pairs, slice_elems)
        elapsed = time.monotonic() - t0
        if it >= args.warmup:
            times_s.append(elapsed)
        verified = verified and hashlib.sha256(buf.tobytes()).hexdigest() == args.expect_sha256
        if args.rank == 0:  # the orchestrator follows these (testbed.experiments.allreduce)
            print("progress " + json.dumps({"done": it + 1, "of": args.warmup + args.iters}),
                  file=sys.stderr, flush=True)
    timed_end = time.monotonic()
    tcp_end = tcp_counters()
    barrier(args.rank, to_next, from_prev)
    for pair in pairs:
        for s in pair:
            s.close()
    # CLOCK_MONOTONIC is system-wide, so these instants line up with the orchestrator's.
    json.dump({"rank": args.rank, "times_s": times_s, "verified": verified,
               "size_bytes": n_elems * 4, "channels": args.channels,
               "timed_window_monotonic_s": [timed_start, timed_end],
               "tcp_out_segs": tcp_end["OutSegs"] - tcp_start["OutSegs"],
               "tcp_retrans_segs": tcp_end["RetransSegs"] - tcp_start["RetransSegs"]},
              sys.stdout)
    sys.stdout.write("\n")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
