"""Message traces: record a workload's messages from its transport, write and read them as
JSON lines, and reissue them with their original timing over any transport.

Recording: a program wraps its transport in ``RecordingTransport`` (origin 0, so times are
CLOCK_MONOTONIC, which every emulated host on one machine shares) and writes its events with
``write_rank_events``: one line per message sent (when the send started) or received (when
it completed). ``merge_events`` pairs the k-th send from a to b with the k-th receive at b
from a, and makes times relative to the first send: the trace, one line per message
{"t_s", "src", "dst", "bytes", "tag", "done_s"}.

Replaying (``python -m testbed.traffic.training.replay --trace ...`` in every rank): every
rank connects to the ranks it exchanges messages with, rank 0
sets a start time on the machine's monotonic clock and sends it to every rank, then each rank
sends its messages at start + t_s (later if the previous message to the
same peer is still going: per-pair order is kept), with one sender and one receiver thread
per peer, fills each message with a pattern of its index and checks it on arrival. Rank 0
prints the completion times beside the recorded ones.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from testbed.traffic.collectives.program import RankSession, broadcast_json, rank_parser, run_program
from testbed.traffic.collectives.transport import RecordingTransport, Transport
from testbed.traffic.training.compute import wait_until

PATTERN_MODULUS = 251  # message i is filled with the byte i mod 251
START_MARGIN_S = 0.05  # rank 0 sets the common start this far ahead, to reach every rank first


@dataclass(frozen=True)
class TraceMessage:
    t_s: float
    src: int
    dst: int
    bytes: int
    tag: str = ""
    done_s: float | None = None


def write_rank_events(path, recorder: RecordingTransport) -> None:
    """This rank's sends and receives as JSON lines (``event``: send or recv)."""
    with open(path, "w") as fh:
        for event, records in (("send", recorder.sent), ("recv", recorder.received)):
            for m in records:
                fh.write(json.dumps({"event": event, "t_s": m.t_s, "src": m.src, "dst": m.dst,
                                     "bytes": m.size_bytes, "tag": m.tag}) + "\n")


def read_json_lines(paths) -> list[dict]:
    rows = []
    for path in paths:
        with open(path) as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return rows


def merge_events(events: list[dict]) -> list[TraceMessage]:
    """Sends paired with their receives (k-th with k-th, pair by pair), times relative to the
    first send, sorted by send time."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for e in events:
        (sends if e["event"] == "send" else recvs)[(e["src"], e["dst"])].append(e)
    if not sends:
        return []
    origin = min(e["t_s"] for pair in sends.values() for e in pair)
    messages = []
    for pair, sent in sends.items():
        sent.sort(key=lambda e: e["t_s"])
        got = sorted(recvs.get(pair, []), key=lambda e: e["t_s"])
        for k, e in enumerate(sent):
            done = got[k]["t_s"] - origin if k < len(got) else None
            if done is not None and got[k]["bytes"] != e["bytes"]:
                raise ValueError(f"message {k} from {pair[0]} to {pair[1]}: sent {e['bytes']} "
                                 f"bytes, received {got[k]['bytes']}")
            messages.append(TraceMessage(e["t_s"] - origin, e["src"], e["dst"], e["bytes"], e["tag"], done))
    return sorted(messages, key=lambda m: (m.t_s, m.src, m.dst))


def write_trace(path, messages: list[TraceMessage]) -> None:
    with open(path, "w") as fh:
        for m in messages:
            fh.write(json.dumps(asdict(m)) + "\n")


def load_trace(paths) -> list[TraceMessage]:
    """A trace from a merged file or from every rank's event files."""
    rows = read_json_lines(paths)
    if rows and "event" in rows[0]:
        return merge_events(rows)
    return [TraceMessage(**row) for row in rows]


def pair_order(messages: list[TraceMessage]) -> dict[tuple[int, int], list[int]]:
    """(src, dst) -> indexes of that pair's messages in send order."""
    order: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in sorted(range(len(messages)), key=lambda i: messages[i].t_s):
        order[(messages[i].src, messages[i].dst)].append(i)
    return dict(order)


def partners(messages: list[TraceMessage], rank: int) -> list[int]:
    """The ranks ``rank`` sends to or receives from in the trace (a symmetric relation, so
    every pair dials each other before the replay starts)."""
    return sorted({m.dst for m in messages if m.src == rank} |
                  {m.src for m in messages if m.dst == rank})


def payload(index: int, size_bytes: int) -> np.ndarray:
    return np.full(size_bytes, index % PATTERN_MODULUS, dtype=np.uint8)


def replay(transport: Transport, messages: list[TraceMessage], speed: float = 1.0) -> dict:
    """This rank's part of the trace, with the original timing divided by ``speed``; empty
    messages are skipped. Returns {"start_monotonic_s", "sent": {index: lateness_s}, "done": {index: done_s},
    "corrupt": [indexes]} (done_s relative to the replay's start)."""
    rank = transport.rank
    # an empty message puts nothing on the wire, so it has no arrival to wait for or time
    order = {pair: [i for i in idx if messages[i].bytes > 0] for pair, idx in pair_order(messages).items()}
    sent, done, corrupt = {}, {}, []
    lock = threading.Lock()
    errors: list[BaseException] = []
    # one start for every rank: CLOCK_MONOTONIC is the machine's, shared by every emulated host
    start = broadcast_json(transport, time.monotonic() + START_MARGIN_S if rank == 0 else None)
    wait_until(start)

    def send_walk(indexes):
        for i in indexes:
            due = start + messages[i].t_s / speed
            wait_until(due)
            lateness = time.monotonic() - due
            transport.send(messages[i].dst, payload(i, messages[i].bytes))
            with lock:
                sent[i] = lateness

    def recv_walk(src, indexes):
        for i in indexes:
            buf = np.empty(messages[i].bytes, dtype=np.uint8)
            transport.recv(src, buf)
            t = time.monotonic() - start
            with lock:
                done[i] = t
                if np.any(buf != i % PATTERN_MODULUS):
                    corrupt.append(i)

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(send_walk, idx), daemon=True)
               for (src, _), idx in order.items() if src == rank]
    threads += [threading.Thread(target=guarded, args=(recv_walk, src, idx), daemon=True)
                for (src, dst), idx in order.items() if dst == rank]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {"start_monotonic_s": start, "sent": sent, "done": done, "corrupt": sorted(corrupt)}


def compare(messages: list[TraceMessage], replayed_done: dict[int, float]) -> dict:
    """Recorded against replayed completion times (s after the first send)."""
    both = [(m.done_s, replayed_done[i]) for i, m in enumerate(messages)
            if m.done_s is not None and i in replayed_done]
    deltas = [r - o for o, r in both]
    recorded_end = max((m.done_s for m in messages if m.done_s is not None), default=0.0)
    replayed_end = max(replayed_done.values(), default=0.0)
    return {"messages": len(messages), "compared": len(both),
            "recorded_completion_s": recorded_end, "replayed_completion_s": replayed_end,
            "completion_ratio": replayed_end / recorded_end if recorded_end > 0 else None,
            "mean_delta_s": sum(deltas) / len(deltas) if deltas else None,
            "max_delta_s": max(deltas, default=None)}


def parse_args(argv):
    ap = rank_parser(__doc__)
    ap.add_argument("--trace", nargs="+", required=True,
                    help="a merged trace, or every rank's event files (merged here)")
    ap.add_argument("--speed", type=float, default=1.0, help="replay this many times faster")
    ap.add_argument("--write-merged", default=None, help="rank 0 writes the merged trace here")
    return ap.parse_args(argv)


def body(argv) -> dict:
    args = parse_args(argv)
    messages = load_trace(args.trace)
    if args.rank == 0 and args.write_merged:
        write_trace(Path(args.write_merged), messages)
    with RankSession(args) as session:
        # every connection open before the common start, so no message waits for a dial
        session.transport.connect(partners(messages, args.rank))
        mine = replay(session.transport, messages, args.speed)
        timed_end = time.monotonic()
        tcp, everyone = session.finish({"done": mine["done"], "corrupt": mine["corrupt"],
                                        "max_lateness_s": max(mine["sent"].values(), default=0.0)})
    out = {"rank": args.rank, "sent": len(mine["sent"]), "received": len(mine["done"]),
           "corrupt": mine["corrupt"], "max_send_lateness_s": max(mine["sent"].values(), default=0.0),
           "verified": not mine["corrupt"],
           "timed_window_monotonic_s": [mine["start_monotonic_s"], timed_end], **tcp}
    if everyone is not None:
        done = {int(i): t for r in everyone for i, t in r["done"].items()}
        corrupt = sum(len(r["corrupt"]) for r in everyone)
        out.update({"comparison": compare(messages, {i: t * args.speed for i, t in done.items()}),
                    "speed": args.speed, "corrupt_total": corrupt,
                    "max_send_lateness_s_all": max(r["max_lateness_s"] for r in everyone),
                    "verified": corrupt == 0 and len(done) == sum(1 for m in messages if m.bytes > 0)})
    return out


def main(argv=None) -> int:
    return run_program(body, argv)


if __name__ == "__main__":
    sys.exit(main())
