"""Loopback micro-benchmark of the engine (no root), in one run:

1. Packets per second per core: the engine's sender (RDMA WRITEs of ``--message-bytes``,
   1 MB by default, from one registered region, reused as perftest does; unpaced, no ACKs
   awaited; smaller messages add their per-message costs) against a plain Python UDP sender
   (``sendto`` of a datagram of the same size in a loop), both counted in CPU time of this
   process (``time.process_time``), alternately plain / engine / plain, to the same sink.
   Two sinks: ``unread`` (a bound socket nobody reads: the kernel drops at its full queue)
   and ``drained`` (a socket read by another process: every packet is delivered).
2. Goodput of one QP between two engines: ``host serve`` and ``host send`` run as two
   processes on 127.0.0.1, and the sender's JSON is summarised.

    python -m testbed.traffic.roce.bench [--packets N] [--mtu 1024] [--message-bytes 1048576]

prints one JSON object (and a summary line on stderr).
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

from . import wire
from .engine import IP_MTU_DISCOVER, IP_PMTUDISC_DO, Engine, EngineConfig
from .psn import PSN_HALF
from .verbs import (CompletionQueue, MemoryRegion, ProtectionDomain, QPConfig, QPInfo,
                    QueuePair, SendWR, WrOpcode)

LOOPBACK = "127.0.0.1"
SINK_BUFFER_BYTES = 4 << 20
FAKE_PEER_QPN = 0x99
ENGINE_RUN_TIMEOUT_S = 300.0
PROCESS_TIMEOUT_S = 600.0
WIRE_OVERHEAD_BYTES = wire.BTH_BYTES + wire.ICRC_BYTES   # a MIDDLE packet around its payload


def plain_sender_pps(dest: tuple[str, int], packets: int, datagram_bytes: int) -> float:
    """Packets per CPU second of a plain UDP sender (same socket options as the engine's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((LOOPBACK, 0))
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        datagram = bytes(datagram_bytes)
        send = sock.sendto
        start = time.process_time()
        for _ in range(packets):
            send(datagram, dest)
        return packets / (time.process_time() - start)


def engine_sender_pps(dest: tuple[str, int], packets: int, mtu: int, message_bytes: int) -> float:
    """Packets per CPU second of the engine sending RDMA WRITEs to ``dest`` (which never
    answers: the window and the timeout are set so that no ACK is awaited)."""
    per_message = -(-message_bytes // mtu)
    messages = -(-packets // per_message)
    with Engine(EngineConfig(LOOPBACK, port=0)) as engine:
        pd = ProtectionDomain(engine)
        mr = MemoryRegion(pd, message_bytes)
        cq = CompletionQueue(messages + 1)
        config = QPConfig(path_mtu_bytes=mtu, max_outstanding_packets=PSN_HALF,
                          ack_timeout_s=ENGINE_RUN_TIMEOUT_S)
        qp = QueuePair(pd, cq, cq, config)
        qp.to_init()
        qp.to_rtr(QPInfo(FAKE_PEER_QPN, 0, dest[0], dest[1], 0x1000, 1, message_bytes))
        qp.to_rts()
        start = time.process_time()
        for i in range(messages):
            qp.post_send(SendWR(i, WrOpcode.RDMA_WRITE, mr, remote_addr=0x1000, rkey=1))
        requester = qp.requester
        if not engine.run_until(lambda: requester.tx >= requester.posted, ENGINE_RUN_TIMEOUT_S):
            raise TimeoutError("the engine did not send everything in time")
        return requester.packets_sent / (time.process_time() - start)


@contextmanager
def sink(kind: str):
    """A destination address: an unread socket, or one drained by another process."""
    if kind == "unread":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((LOOPBACK, 0))
            yield sock.getsockname()
        return
    proc = subprocess.Popen([sys.executable, "-m", "testbed.traffic.roce.bench", "drain"],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield (LOOPBACK, port)
    finally:
        proc.kill()
        proc.wait()


def drain() -> None:
    """Read and discard datagrams for ever (the ``drained`` sink); print the port first."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SINK_BUFFER_BYTES)
        sock.bind((LOOPBACK, 0))
        print(sock.getsockname()[1], flush=True)
        buffer = bytearray(1 << 16)
        while True:
            sock.recv_into(buffer)


def measure_pps(packets: int, mtu: int, message_bytes: int, kind: str) -> dict:
    """Plain, engine, plain to one sink; the ratio is the engine's over the plain mean."""
    datagram_bytes = mtu + WIRE_OVERHEAD_BYTES
    with sink(kind) as dest:
        plain_before = plain_sender_pps(dest, packets, datagram_bytes)
        engine = engine_sender_pps(dest, packets, mtu, message_bytes)
        plain_after = plain_sender_pps(dest, packets, datagram_bytes)
    plain = (plain_before + plain_after) / 2
    return {"sink": kind, "packets": packets, "datagram_bytes": datagram_bytes,
            "plain_pps_per_core": plain, "plain_runs": [plain_before, plain_after],
            "engine_pps_per_core": engine, "ratio": engine / plain}


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def run_hosts(senders: list[list[str]], serve_args: list[str] = (),
              timeout_s: float = PROCESS_TIMEOUT_S) -> tuple[list[dict], dict]:
    """Run one ``host serve`` for all ``senders`` and one ``host send`` per sender, at once,
    on 127.0.0.1 (free ports); return the senders' JSON results and the server's. Each
    sender's arguments add to --bind/--port/--peer/--side-port."""
    side_port = free_port(socket.SOCK_STREAM)
    host = [sys.executable, "-m", "testbed.traffic.roce.host"]
    server = subprocess.Popen(
        host + ["serve", "--bind", LOOPBACK, "--port", str(free_port(socket.SOCK_DGRAM)),
                "--side-port", str(side_port), "--connections", str(len(senders)), *serve_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients = [subprocess.Popen(
        host + ["send", "--bind", LOOPBACK, "--port", str(free_port(socket.SOCK_DGRAM)),
                "--peer", LOOPBACK, "--side-port", str(side_port), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args in senders]
    try:
        outputs = [client.communicate(timeout=timeout_s) for client in clients]
        served, serve_err = server.communicate(timeout=timeout_s)
    finally:
        for proc in (server, *clients):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if not served or not all(out for out, _ in outputs):
        errors = " | ".join(err[-1000:] for _, err in outputs)
        raise RuntimeError(f"host printed nothing: {errors} {serve_err[-1000:]}")
    return [json.loads(out) for out, _ in outputs], json.loads(served)


def run_pair(send_args: list[str], serve_args: list[str] = (),
             timeout_s: float = PROCESS_TIMEOUT_S) -> tuple[dict, dict]:
    """``run_hosts`` with one sender: (sender's result, server's result)."""
    (sent,), served = run_hosts([send_args], serve_args, timeout_s)
    return sent, served


def measure_goodput(total_bytes: int, message_bytes: int, mtu: int) -> dict:
    """One QP between two engines in two processes (``host serve`` / ``host send``)."""
    result, _ = run_pair(["--size", str(message_bytes), "--mtu", str(mtu),
                          "--count", str(max(1, total_bytes // message_bytes)),
                          "--series-max-points", "10"])
    keys = ("goodput_mbit", "bytes_delivered", "elapsed_s", "messages", "packets_sent",
            "retransmitted_packets", "naks", "timeouts", "data_verified")
    return {key: result[key] for key in keys}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.traffic.roce.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", choices=("run", "drain"), default="run")
    parser.add_argument("--packets", type=int, default=200_000)
    parser.add_argument("--mtu", type=int, choices=wire.PATH_MTUS, default=1024)
    parser.add_argument("--message-bytes", type=int, default=1 << 20,
                        help="WRITE size of the pps run (one region, reused, as perftest does)")
    parser.add_argument("--sink", choices=("unread", "drained", "both"), default="both")
    parser.add_argument("--goodput-bytes", type=int, default=200 << 20)
    parser.add_argument("--goodput-message-bytes", type=int, default=1 << 20)
    parser.add_argument("--no-goodput", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.role == "drain":
        drain()
        return 0
    kinds = ("unread", "drained") if args.sink == "both" else (args.sink,)
    result = {"mtu_bytes": args.mtu, "message_bytes": args.message_bytes,
              "pps": [measure_pps(args.packets, args.mtu, args.message_bytes, k) for k in kinds]}
    if not args.no_goodput:
        result["goodput"] = measure_goodput(args.goodput_bytes, args.goodput_message_bytes,
                                            args.mtu)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    for row in result["pps"]:
        print(f"{row['sink']:8s} plain {row['plain_pps_per_core']:10.0f} pps/core  engine "
              f"{row['engine_pps_per_core']:10.0f} pps/core  ratio {row['ratio']:.2f}",
              file=sys.stderr)
    if "goodput" in result:
        g = result["goodput"]
        print(f"one QP on 127.0.0.1: {g['goodput_mbit']:.0f} Mbit/s, verified "
              f"{g['data_verified']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
