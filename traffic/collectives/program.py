"""What every host program shares: the rank and address arguments, the TCP transport, the
cost-model arguments (or a calibration), TCP counters, small gathers to rank 0, and the
one-JSON-object output with its exit status (0 when the data verified, 1 when not or on an
error, reported as {"error": ...}), and rank 0's progress lines on stderr.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import time
import traceback

import numpy as np

from testbed.traffic.collectives.cost import AlphaBeta, link_alpha_beta
from testbed.traffic.collectives.executor import DEFAULT_SLICE_BYTES, Executor, plan_rank
from testbed.traffic.collectives.schedule import Schedule, make_schedule, new_phase, recv, send
from testbed.traffic.collectives.transport import (
    CONNECT_TIMEOUT_S,
    IO_TIMEOUT_S,
    TcpTransport,
    Transport,
)

DEFAULT_PORT = 29500
DEFAULT_ROCE_PORT = 4791
TRANSPORTS = ("tcp", "roce")
SIZE_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
CALIBRATE_SMALL_BYTES = 8
CALIBRATE_LARGE_BYTES = 4 * 2**20
CALIBRATE_REPEATS = 10
LENGTH = struct.Struct("!Q")


def parse_size(text: str) -> int:
    """'8', '64K', '128M', '1G' (powers of 1024, as nccl-tests reads them) -> bytes."""
    text = text.strip().upper().removesuffix("B")
    suffix = text[-1:] if text[-1:] in SIZE_SUFFIXES else ""
    return int(float(text[: len(text) - len(suffix)]) * SIZE_SUFFIXES[suffix])


def parse_hosts(text: str, default_port: int) -> dict[int, tuple[str, int]]:
    """'10.0.0.1,10.0.0.2:29600,...' -> {rank: (ip, port)}; rank = position in the list."""
    table = {}
    for rank, entry in enumerate(e.strip() for e in text.split(",") if e.strip()):
        ip, _, port = entry.partition(":")
        table[rank] = (ip, int(port) if port else default_port)
    return table


def parse_groups(text: str | None) -> list[list[int]] | None:
    """'0,1,2,3/4,5,6,7' -> [[0, 1, 2, 3], [4, 5, 6, 7]] (node groups, leader first)."""
    if not text:
        return None
    return [[int(r) for r in group.split(",")] for group in text.split("/")]


def rank_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the arguments every rank program takes."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--hosts", required=True,
                    help="every rank's address in rank order: ip[:port],ip[:port],...")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help="port where --hosts gives none")
    ap.add_argument("--channels", type=int, default=4, help="TCP connections per peer and direction")
    ap.add_argument("--dscp", type=int, default=None, help="DSCP on every connection")
    ap.add_argument("--connect-timeout-s", type=float, default=CONNECT_TIMEOUT_S)
    ap.add_argument("--io-timeout-s", type=float, default=IO_TIMEOUT_S)
    return ap


def add_transport_arguments(ap: argparse.ArgumentParser) -> None:
    """--transport tcp|roce, and the RoCE transport's port, path MTU, pace, window and ACK
    timeout."""
    ap.add_argument("--transport", choices=TRANSPORTS, default="tcp",
                    help="TCP connections, or RoCE QPs (testbed.traffic.collectives."
                         "roce_transport; needs --hosts)")
    ap.add_argument("--roce-port", type=int, default=DEFAULT_ROCE_PORT,
                    help="UDP port of the RoCE engine (0: any free one)")
    ap.add_argument("--roce-mtu", type=int, default=4096, choices=(256, 512, 1024, 2048, 4096),
                    help="RoCE path MTU")
    ap.add_argument("--roce-rate-mbit", type=float, default=None,
                    help="pace every QP at this rate (default: unpaced)")
    ap.add_argument("--roce-max-outstanding", type=int, default=64,
                    help="RoCE packets in flight per QP")
    ap.add_argument("--roce-ack-timeout-s", type=float, default=None,
                    help="every QP's local ACK timeout (default: the verbs default, 67 ms; "
                         "set it above the fabric's queueing RTT)")


def open_transport(args, addresses: dict | None = None, world: int | None = None,
                   listen: tuple[str, int] | None = None) -> Transport:
    addresses = parse_hosts(args.hosts, args.port) if addresses is None else addresses
    if getattr(args, "transport", "tcp") == "roce":
        from testbed.traffic.collectives.roce_transport import RoceTransport

        return RoceTransport(args.rank, len(addresses) if world is None else world, addresses,
                             channels=args.channels, roce_port=args.roce_port,
                             mtu_bytes=args.roce_mtu, rate_mbit=args.roce_rate_mbit,
                             max_outstanding=args.roce_max_outstanding,
                             ack_timeout_s=args.roce_ack_timeout_s,
                             connect_timeout_s=args.connect_timeout_s,
                             io_timeout_s=args.io_timeout_s)
    return TcpTransport(args.rank, len(addresses) if world is None else world, addresses,
                        listen=listen, channels=args.channels, dscp=args.dscp,
                        connect_timeout_s=args.connect_timeout_s, io_timeout_s=args.io_timeout_s)


class RankSession:
    """One run of a rank program: its transport, opened from the arguments, and this
    namespace's TCP counters from the start. ``finish`` ends every program the same way."""

    def __init__(self, args, **open_kwargs):
        self.tcp_start = tcp_counters()
        self.transport = open_transport(args, **open_kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.transport.close()

    def finish(self, summary: dict | None = None) -> tuple[dict, list | None]:
        """TCP segments sent and retransmitted since the start; then, with a ``summary``,
        every rank's summary (with its TCP counts) at rank 0 (None elsewhere); and a last
        barrier, so no rank closes its connections while another still reads."""
        tcp = tcp_delta(self.tcp_start, tcp_counters())
        self.transport.barrier()
        everyone = None
        if summary is not None:
            everyone = gather_json(self.transport, {**summary, **tcp})
            self.transport.barrier()
        return tcp, everyone


def add_collective_arguments(ap: argparse.ArgumentParser, algorithms: tuple[str, ...] | None,
                             default: str | None, help_algo: str = "the collective's algorithm") -> None:
    """--algo, --groups (node groups for hierarchical), --slice-bytes and --seed."""
    ap.add_argument("--algo", choices=algorithms, default=default, help=help_algo)
    ap.add_argument("--groups", type=parse_groups, default=None,
                    help="node groups for hierarchical, leader first: 0,1,2,3/4,5,6,7")
    ap.add_argument("--slice-bytes", type=parse_size, default=DEFAULT_SLICE_BYTES,
                    help="the executor's slice: messages stream through in pieces this big")
    ap.add_argument("--seed", type=int, default=1, help="seeds every rank's data")


def add_cost_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--link-rate-mbit", type=float, default=None,
                    help="bottleneck rate between ranks for the cost model (default: calibrate)")
    ap.add_argument("--alpha-us", type=float, default=None, help="per-message latency for the cost model")
    ap.add_argument("--intra-link-rate-mbit", type=float, default=None,
                    help="rate inside a node group (hierarchical); default: --link-rate-mbit")
    ap.add_argument("--intra-alpha-us", type=float, default=None)


def cost_links(args, transport: Transport) -> tuple[AlphaBeta, AlphaBeta, str]:
    """(inter-node link, intra-node link, where they came from): the arguments, or a
    ping-pong calibration between ranks 0 and 1 that every rank agrees on."""
    if args.link_rate_mbit is not None:
        link = link_alpha_beta(args.link_rate_mbit, host_latency_s=(args.alpha_us or 0.0) * 1e-6)
        source = "arguments"
    else:
        link = calibrate(transport, args.slice_bytes)
        source = "calibrated by ping-pong between ranks 0 and 1"
    intra = link
    if args.intra_link_rate_mbit is not None:
        intra = link_alpha_beta(args.intra_link_rate_mbit,
                                host_latency_s=(args.intra_alpha_us or 0.0) * 1e-6)
    return link, intra, source


def alpha_beta_json(link: AlphaBeta) -> dict:
    return {"alpha_us": link.alpha_s * 1e6, "beta_ns_per_byte": link.beta_s_per_byte * 1e9,
            "rate_mbit": link.rate_mbit}


def links_json(link: AlphaBeta, intra: AlphaBeta, source: str) -> dict:
    return {"source": source, "link": alpha_beta_json(link), "intra_link": alpha_beta_json(intra)}


def ping_pong_schedule(world: int, size_bytes: int) -> Schedule:
    """Rank 0 sends ``size_bytes`` to rank 1, which sends them back; the others idle."""
    phase = new_phase(world, 2)
    phase[0][0].append(send(1, 0, size_bytes))
    phase[1][0].append(recv(0, 0, size_bytes))
    phase[1][1].append(send(0, 0, size_bytes))
    phase[0][1].append(recv(1, 0, size_bytes))
    return make_schedule("ping_pong", world, [phase], size_bytes)


def ping_pong_s(executor: Executor, size_bytes: int, repeats: int, slice_bytes: int) -> float:
    """Best round trip of ``size_bytes`` between ranks 0 and 1, through the executor as
    every collective runs, so its threads' hand-offs count in alpha."""
    rank = executor.transport.rank
    plan = plan_rank(ping_pong_schedule(executor.transport.world, size_bytes), rank, slice_bytes)
    buf = np.zeros(size_bytes, dtype=np.uint8)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.monotonic()
        executor.run(plan, buf)
        best = min(best, time.monotonic() - t0)
    return best


def calibrate(transport: Transport, slice_bytes: int = DEFAULT_SLICE_BYTES) -> AlphaBeta:
    """alpha from the round trip of a tiny message, beta from a large one, measured between
    ranks 0 and 1 and sent by rank 0 to every rank."""
    if transport.world < 2:
        return AlphaBeta(0.0, 1e-12)
    transport.barrier()
    with Executor(transport) as executor:
        small = ping_pong_s(executor, CALIBRATE_SMALL_BYTES, CALIBRATE_REPEATS, slice_bytes)
        large = ping_pong_s(executor, CALIBRATE_LARGE_BYTES, CALIBRATE_REPEATS, slice_bytes)
    measured = [small / 2, max(large / 2 - small / 2, 1e-12) / CALIBRATE_LARGE_BYTES]
    alpha_s, beta_s_per_byte = broadcast_json(transport, measured if transport.rank == 0 else None)
    return AlphaBeta(alpha_s, beta_s_per_byte)


def _send_json(transport: Transport, peer: int, obj) -> None:
    payload = json.dumps(obj).encode()
    transport.send(peer, LENGTH.pack(len(payload)))
    transport.send(peer, payload)


def _recv_json(transport: Transport, peer: int):
    head = bytearray(LENGTH.size)
    transport.recv(peer, head)
    payload = bytearray(LENGTH.unpack(head)[0])
    transport.recv(peer, payload)
    return json.loads(payload)


def gather_json(transport: Transport, obj, root: int = 0) -> list | None:
    """Every rank's ``obj`` at ``root`` (in rank order); None elsewhere."""
    if transport.rank != root:
        _send_json(transport, root, obj)
        return None
    return [obj if r == root else _recv_json(transport, r) for r in range(transport.world)]


def broadcast_json(transport: Transport, obj, root: int = 0):
    """``root``'s ``obj`` on every rank."""
    if transport.rank == root:
        for r in range(transport.world):
            if r != root:
                _send_json(transport, r, obj)
        return obj
    return _recv_json(transport, root)


def tcp_counters() -> dict[str, int]:
    """This network namespace's TCP counters (OutSegs, RetransSegs, ...) from /proc/net/snmp."""
    with open("/proc/net/snmp") as fh:
        rows = [line.split() for line in fh if line.startswith("Tcp:")]
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:])}


def tcp_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {"tcp_out_segs": after["OutSegs"] - before["OutSegs"],
            "tcp_retrans_segs": after["RetransSegs"] - before["RetransSegs"]}


PROGRESS_PREFIX = "progress "  # rank 0's stderr lines: progress {"done": i, "of": n}


def report_progress(done: int, of: int) -> None:
    """One progress line on stderr, which the orchestrator follows (rank 0 writes them)."""
    print(PROGRESS_PREFIX + json.dumps({"done": done, "of": of}), file=sys.stderr, flush=True)


def emit(obj: dict) -> None:
    json.dump(obj, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


def run_program(body, argv=None) -> int:
    """Run ``body(argv)`` (returns the output dict with "verified"), print it as one JSON
    object; 0 when verified, 1 when not or on an error ({"error": ...}, traceback on stderr)."""
    try:
        out = body(argv)
    except SystemExit:
        raise
    except BaseException as exc:  # one JSON object whatever happens
        traceback.print_exc()
        emit({"error": f"{type(exc).__name__}: {exc}", "verified": False})
        return 1
    emit(out)
    return 0 if out.get("verified") else 1
