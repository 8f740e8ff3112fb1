"""nccl-tests for emulated hosts: one rank of a collective size sweep over TCP.

Run in every rank: ``python -m testbed.traffic.collectives.sweep --rank R --hosts
ip0,ip1,... --op allreduce --algo ring -b 8 -e 1M -f 2 -w 1 -n 5``. For each size from -b to
-e (times -f each step) every rank runs -w warm-up and -n timed iterations back to back,
then one more on fresh inputs that it checks against the expected values (#wrong). Time is
the mean over ranks of each rank's time per iteration (nccl-tests' default -a 1); algbw =
S/t, busbw = algbw times the collective's factor. Beside each measurement, the alpha-beta
prediction (--link-rate-mbit/--alpha-us, or a calibration between ranks 0 and 1); with
--algo auto the cheapest algorithm by that model runs. Rank 0 prints the whole sweep as one
JSON object (with the nccl-tests table as text, and each size's timed window in
CLOCK_MONOTONIC); the other ranks print their own part. Rank 0 reports each size done on
stderr (progress lines).
"""
from __future__ import annotations

import sys
import time

from testbed.traffic.collectives.cost import algbw_gbyte, busbw_factor, choose, gbyte_to_mbit, predict_s
from testbed.traffic.collectives.data import (
    ALGORITHMS,
    BROADCAST,
    OPS,
    REDOP,
    REDUCESCATTER,
    ALLREDUCE,
    TYPE_NAME,
    op_sizes,
)
from testbed.traffic.collectives.executor import Executor
from testbed.traffic.collectives.program import (
    RankSession,
    add_collective_arguments,
    add_cost_arguments,
    cost_links,
    links_json,
    parse_size,
    rank_parser,
    report_progress,
    run_program,
)
from testbed.traffic.collectives.runner import PreparedCollective

AUTO = "auto"
US_PER_S = 1e6


def sweep_sizes(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """nccl-tests' sizes: min, min*f, ... up to max."""
    if min_bytes < 0 or max_bytes < min_bytes or factor <= 1:
        raise ValueError(f"bad sweep -b {min_bytes} -e {max_bytes} -f {factor}")
    sizes, size = [], max(min_bytes, 1)
    if min_bytes == 0:
        sizes.append(0)
    while size <= max_bytes:
        sizes.append(int(size))
        size *= factor
    return sizes


def redop_of(op: str) -> str:
    return REDOP if op in (ALLREDUCE, REDUCESCATTER) else "none"


TABLE_HEADER = ("#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
                "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       ")


def format_table(rows: list[dict]) -> str:
    """The nccl-tests table (one result per row: size count type redop root time algbw busbw
    #wrong) of sweep result rows."""
    lines = [TABLE_HEADER]
    for r in rows:
        lines.append(f"{r['size_bytes']:12d}  {r['count']:12d}  {r['type']:>8s}  {r['redop']:>6s}  "
                     f"{r['root']:6d}  {r['time_us']:7.1f}  {r['algbw_gbyte_s']:6.2f}  "
                     f"{r['busbw_gbyte_s']:6.2f}  {r['wrong']:5d}")
    return "\n".join(lines)


def result_row(op: str, world: int, sizes, algorithm: str, root: int, rank_times_s: list[float],
               wrong: int, predicted_s: float) -> dict:
    """One size's line: the measurement (mean of the ranks' times) and the prediction."""
    t = sum(rank_times_s) / len(rank_times_s)
    algbw = algbw_gbyte(sizes.size_bytes, t) if t > 0 else 0.0
    busbw = algbw * busbw_factor(op, world)
    return {"size_bytes": sizes.size_bytes, "count": sizes.count, "type": TYPE_NAME,
            "redop": redop_of(op), "root": root if op == BROADCAST else -1, "algorithm": algorithm,
            "time_us": t * US_PER_S, "time_us_max": max(rank_times_s) * US_PER_S,
            "algbw_gbyte_s": algbw, "busbw_gbyte_s": busbw,
            "algbw_mbit_s": gbyte_to_mbit(algbw), "busbw_mbit_s": gbyte_to_mbit(busbw),
            "wrong": wrong, "predicted_us": predicted_s * US_PER_S,
            "predicted_busbw_gbyte_s": (algbw_gbyte(sizes.size_bytes, predicted_s) * busbw_factor(op, world)
                                        if predicted_s > 0 else 0.0)}


def parse_args(argv):
    ap = rank_parser(__doc__)
    ap.add_argument("--op", choices=OPS, default=ALLREDUCE)
    ap.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("1M"))
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0)
    ap.add_argument("-w", "--warmup-iters", type=int, default=1)
    ap.add_argument("-n", "--iters", type=int, default=5)
    ap.add_argument("-c", "--check", type=int, default=1, help="1: check results (#wrong), 0: do not")
    ap.add_argument("--root", type=int, default=0, help="Broadcast root")
    add_collective_arguments(ap, None, None, "an algorithm of --op, or auto (default: its first)")
    add_cost_arguments(ap)
    args = ap.parse_args(argv)
    args.algo = args.algo or ALGORITHMS[args.op][0]
    if args.algo != AUTO and args.algo not in ALGORITHMS[args.op]:
        ap.error(f"{args.op} has no algorithm {args.algo!r}; known: {', '.join(ALGORITHMS[args.op])}, auto")
    return args


def candidates(op: str, groups) -> tuple[str, ...]:
    return tuple(a for a in ALGORITHMS[op] if a != "hierarchical" or groups)


def run_sweep(args, session: RankSession) -> dict:
    transport = session.transport
    world = transport.world
    link, intra, source = cost_links(args, transport)
    model_kwargs = {"slice_bytes": args.slice_bytes, "groups": args.groups, "intra": intra}
    mine = []
    timed_start = None
    all_sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    with Executor(transport) as executor:
        for done, size in enumerate(all_sizes, 1):
            sizes = op_sizes(args.op, size, world)
            if args.algo == AUTO:
                algorithm, predicted = choose(args.op, world, sizes.size_bytes, link,
                                              candidates(args.op, args.groups), **model_kwargs)
            else:
                algorithm = args.algo
                predicted = predict_s(args.op, algorithm, world, sizes.size_bytes, link, **model_kwargs)
            with PreparedCollective(executor, sizes, algorithm, args.seed, args.slice_bytes,
                                    args.root, args.groups) as coll:
                for _ in range(args.warmup_iters):
                    coll.run()
                transport.barrier()
                t0 = time.monotonic()
                timed_start = t0 if timed_start is None else timed_start
                for _ in range(args.iters):
                    coll.run()
                t1 = time.monotonic()
                elapsed_s = (t1 - t0) / max(args.iters, 1)
                wrong = 0
                if args.check:
                    coll.reset()
                    transport.barrier()
                    coll.run()
                    wrong = coll.wrong()
            mine.append({"size_bytes": sizes.size_bytes, "algorithm": algorithm,
                         "predicted_s": predicted, "time_s": elapsed_s, "wrong": wrong,
                         "window_monotonic_s": [t0, t1]})
            if transport.rank == 0:
                report_progress(done, len(all_sizes))
        timed_end = time.monotonic()
    summary = {"rank": transport.rank, "sizes": mine, "wrong_total": sum(m["wrong"] for m in mine),
               "timed_window_monotonic_s": [timed_start, timed_end]}
    tcp, everyone = session.finish(summary)
    if everyone is None:
        return {**summary, **tcp, "verified": summary["wrong_total"] == 0}
    rows = []
    for i, m in enumerate(mine):
        sizes = op_sizes(args.op, m["size_bytes"], world)
        row = result_row(args.op, world, sizes, m["algorithm"], args.root,
                         [s["sizes"][i]["time_s"] for s in everyone],
                         sum(s["sizes"][i]["wrong"] for s in everyone), m["predicted_s"])
        windows = [s["sizes"][i]["window_monotonic_s"] for s in everyone]
        row["window_monotonic_s"] = [min(w[0] for w in windows), max(w[1] for w in windows)]
        rows.append(row)
    wrong_total = sum(r["wrong"] for r in rows)
    return {"rank": 0, "world": world, "op": args.op, "algorithm": args.algo,
            "channels": args.channels, "slice_bytes": args.slice_bytes,
            "warmup_iters": args.warmup_iters, "iters": args.iters, "checked": bool(args.check),
            "cost_model": links_json(link, intra, source), "results": rows,
            "wrong_total": wrong_total, "verified": wrong_total == 0,
            "timed_window_monotonic_s": [min(s["timed_window_monotonic_s"][0] for s in everyone),
                                         max(s["timed_window_monotonic_s"][1] for s in everyone)],
            "tcp_out_segs": sum(s["tcp_out_segs"] for s in everyone),
            "tcp_retrans_segs": sum(s["tcp_retrans_segs"] for s in everyone),
            "table": format_table(rows)}


def body(argv) -> dict:
    args = parse_args(argv)
    with RankSession(args) as session:
        return run_sweep(args, session)


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    sys.exit(main())
