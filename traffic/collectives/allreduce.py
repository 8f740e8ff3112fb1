"""One rank of an AllReduce over TCP (or RoCE QPs, ``--transport roce``), run inside an
emulated host; the drop-in for the ring program the experiments start (same arguments, same
JSON line).

Each rank builds its input from (seed, rank), runs warm-up and timed iterations (each on a
fresh copy of its input, after a barrier), and checks every result against the SHA-256 of
the expected sum given by the orchestrator; when a digest differs it also counts the wrong
elements. With ``--next-ip`` the rank knows only its ring successor (ring algorithm only);
with ``--hosts`` it knows every rank and may run any AllReduce algorithm. ``--channels``
TCP connections (or RoCE QPs) per peer carry the buffer's segments as channels. Prints one JSON line: times,
verdict, the timed window in CLOCK_MONOTONIC (system-wide, so it lines up with the
orchestrator's samplers) and this namespace's TCP segment counters over the run.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time

from testbed.traffic.collectives.data import (
    ALGORITHMS,
    ALLREDUCE,
    expected_sum,
    op_sizes,
)
from testbed.traffic.collectives.executor import Executor
from testbed.traffic.collectives.program import (
    DEFAULT_PORT,
    RankSession,
    add_collective_arguments,
    add_transport_arguments,
    parse_hosts,
    report_progress,
    run_program,
)
from testbed.traffic.collectives.runner import PreparedCollective
from testbed.traffic.collectives.transport import CONNECT_TIMEOUT_S, IO_TIMEOUT_S


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=None, help="ranks (default: the length of --hosts)")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--next-ip", help="the ring successor's address (ring only)")
    where.add_argument("--hosts", help="every rank's ip[:port], in rank order")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="listening port of every rank")
    ap.add_argument("--listen-ip", default="0.0.0.0", help="address to listen on with --next-ip")
    ap.add_argument("--size-bytes", type=int, required=True, help="AllReduce size S (float32)")
    ap.add_argument("--channels", type=int, default=4, help="TCP connections per peer")
    add_collective_arguments(ap, ALGORITHMS[ALLREDUCE], "ring", "the AllReduce algorithm")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--dscp", type=int, default=None)
    ap.add_argument("--connect-timeout-s", type=float, default=CONNECT_TIMEOUT_S)
    ap.add_argument("--io-timeout-s", type=float, default=IO_TIMEOUT_S)
    ap.add_argument("--expect-sha256", required=True, help="digest of the expected sum")
    add_transport_arguments(ap)
    args = ap.parse_args(argv)
    if args.transport == "roce" and args.hosts is None:
        ap.error("--transport roce needs every rank's address (--hosts)")
    if args.next_ip is not None:
        if args.world is None:
            ap.error("--next-ip needs --world")
        if args.algo != "ring":
            ap.error(f"--algo {args.algo} needs every rank's address (--hosts)")
    return args


def expected_digest(world: int, size_bytes: int, seed: int) -> str:
    """What the orchestrator passes as --expect-sha256."""
    sizes = op_sizes(ALLREDUCE, size_bytes, world)
    return hashlib.sha256(expected_sum(world, sizes.total_elems, seed).tobytes()).hexdigest()


def body(argv) -> dict:
    args = parse_args(argv)
    if args.hosts is not None:
        addresses = parse_hosts(args.hosts, args.port)
        world, listen = args.world or len(addresses), None
    else:
        world = args.world
        addresses = {(args.rank + 1) % world: (args.next_ip, args.port)}
        listen = (args.listen_ip, args.port)
    sizes = op_sizes(ALLREDUCE, args.size_bytes, world)
    times_s, wrong, verified = [], 0, True
    with RankSession(args, addresses=addresses, world=world, listen=listen) as session, \
            Executor(session.transport) as executor:
        transport = session.transport
        timed_start = None
        with PreparedCollective(executor, sizes, args.algo, args.seed, args.slice_bytes,
                                groups=args.groups) as coll:
            channels_used = coll.channels_used
            for it in range(args.warmup + args.iters):
                coll.reset()
                transport.barrier()
                t0 = time.monotonic()
                if it == args.warmup:
                    timed_start = t0
                coll.run()
                elapsed = time.monotonic() - t0
                if it >= args.warmup:
                    times_s.append(elapsed)
                if hashlib.sha256(memoryview(coll.work)).hexdigest() != args.expect_sha256:
                    verified = False
                    wrong = max(wrong, coll.wrong())
                if args.rank == 0:  # the orchestrator follows these lines (its progress)
                    report_progress(it + 1, args.warmup + args.iters)
        timed_end = time.monotonic()
        tcp, _ = session.finish()
        roce = transport.stats()["engine"] if args.transport == "roce" else None
    return {"rank": args.rank, "times_s": times_s, "verified": verified, "wrong": wrong,
            "size_bytes": sizes.size_bytes, "channels": args.channels,
            "channels_used": channels_used, "algorithm": args.algo,
            "transport": args.transport, "roce": roce,
            "timed_window_monotonic_s": [timed_start, timed_end], **tcp}


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    sys.exit(main())
