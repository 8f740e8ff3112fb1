"""Partition/aggregate queries over TCP, run inside emulated hosts: the incast workload.

One receiver (the aggregator) holds a TCP connection to each of N senders (the workers). A
query sends a request to every sender at the same instant; each sender answers with the
number of bytes the request names, and the query completes when the last byte of the last
response has arrived. The answers all converge on the receiver's link at once, which is
what overflows its switch queue (incast).

    python -m testbed.traffic.incast serve --port 5600 --dscp 26 --connections 1
    python -m testbed.traffic.incast query --servers 10.1.0.2,10.2.0.2 --port 5600 \\
        --response-bytes 65536 --warmup 1 --rounds 20 --gap-s 0.2 --dscp 26

Framing: a request is ``REQUEST`` (4-byte magic, 8-byte unsigned byte count, network byte
order); the response is exactly that many bytes. A connection carries any number of
request/response exchanges, one at a time; closing it ends the server's side.

``serve`` prints one JSON line once it listens ({"listening_port": P}, useful with
``--port 0``) and, with ``--connections N``, exits after N connections have been served to
their end. ``query`` prints one JSON object: per round the monotonic start time, every
flow's completion time and the round's (all times in seconds from the round's first
request), the ``--warmup`` rounds (the first exchanges over new connections, which also
meet every cold cache on the path) kept apart; ``error`` says why the rounds stopped early,
if they did (exit status 1). With ``--hold-after-warmup`` it first prints the line
``warmed`` after the warm-up and waits for a line on stdin, so that a caller reads every
host's counters over the recorded queries only.

Both ends can put their packets in a traffic class: ``--dscp D`` sets IP_TOS to D << 2 on
every socket before it connects or listens, so SYNs, requests, data and ACKs all carry it
(the kernel keeps the two ECN bits of a TCP socket its own).
"""
from __future__ import annotations

import argparse
import json
import selectors
import socket
import struct
import sys
import threading
import time

REQUEST = struct.Struct("!4sQ")
MAGIC = b"INC1"
MAX_DSCP = 63
SEND_CHUNK_BYTES = 256 * 1024  # one preallocated block of zeros, sent as often as needed
RECV_CHUNK_BYTES = 256 * 1024
CONNECT_RETRY_S = 0.05  # servers may still be starting when the client first tries
DEFAULT_CONNECT_TIMEOUT_S = 30.0
DEFAULT_ROUND_TIMEOUT_S = 60.0
LISTEN_BACKLOG = 64
WARMED_LINE = "warmed"  # --hold-after-warmup's line on stdout, before the result's JSON


class RoundTimeout(Exception):
    """A round's responses did not all arrive in time."""


# --- framing ----------------------------------------------------------------------------------


def encode_request(response_bytes: int) -> bytes:
    """The request asking a server for ``response_bytes`` bytes (at least one)."""
    if isinstance(response_bytes, bool) or not isinstance(response_bytes, int) \
            or not 1 <= response_bytes < 2**64:
        raise ValueError(f"response_bytes must be an integer in [1, 2^64), got {response_bytes!r}")
    return REQUEST.pack(MAGIC, response_bytes)


def decode_request(data: bytes) -> int:
    """The byte count a request asks for; ValueError for anything that is not a request."""
    if len(data) != REQUEST.size:
        raise ValueError(f"a request has {REQUEST.size} bytes, got {len(data)}")
    magic, response_bytes = REQUEST.unpack(data)
    if magic != MAGIC:
        raise ValueError(f"not an incast request (magic {magic!r})")
    if response_bytes == 0:
        raise ValueError("a request must ask for at least one byte")
    return response_bytes


def set_dscp(sock: socket.socket, dscp: int) -> None:
    """Put the socket's packets in DSCP ``dscp`` (IP_TOS = dscp << 2)."""
    if isinstance(dscp, bool) or not isinstance(dscp, int) or not 0 <= dscp <= MAX_DSCP:
        raise ValueError(f"dscp must be an integer in [0, {MAX_DSCP}], got {dscp!r}")
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)


def recv_exact_or_eof(sock: socket.socket, nbytes: int) -> bytes | None:
    """``nbytes`` bytes, or None when the peer closed before the first of them."""
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return None
            raise ConnectionError(f"peer closed after {got} of {nbytes} bytes")
        got += n
    return bytes(buf)


# --- server -----------------------------------------------------------------------------------


def open_listener(bind_ip: str, port: int, dscp: int) -> socket.socket:
    """A listening TCP socket whose connections carry ``dscp``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_dscp(sock, dscp)
        sock.bind((bind_ip, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def serve_connection(conn: socket.socket) -> int:
    """Answer every request on ``conn`` until the peer closes it; returns the count."""
    block = memoryview(bytes(SEND_CHUNK_BYTES))
    served = 0
    with conn:
        while True:
            header = recv_exact_or_eof(conn, REQUEST.size)
            if header is None:
                return served
            remaining = decode_request(header)
            while remaining:
                n = min(remaining, SEND_CHUNK_BYTES)
                conn.sendall(block[:n])
                remaining -= n
            served += 1


def serve(listener: socket.socket, dscp: int, connections: int | None = None) -> None:
    """Accept connections on ``listener`` and answer their requests, one thread each; with
    ``connections``, return once that many have been accepted and served to their end."""
    workers = []
    accepted = 0
    while connections is None or accepted < connections:
        conn, _ = listener.accept()
        accepted += 1
        set_dscp(conn, dscp)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        worker = threading.Thread(target=serve_connection, args=(conn,), daemon=True)
        worker.start()
        workers.append(worker)
    for worker in workers:
        worker.join()


# --- client -----------------------------------------------------------------------------------


def connect_all(servers: list[tuple[str, int]], dscp: int,
                timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[socket.socket]:
    """One connection per server, in order, retried until ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    socks: list[socket.socket] = []
    try:
        for ip, port in servers:
            while True:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                set_dscp(sock, dscp)  # before connect: the SYN carries it too
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    sock.connect((ip, port))
                    break
                except OSError:
                    sock.close()
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"cannot connect to {ip}:{port} within "
                                           f"{timeout_s:g} s") from None
                    time.sleep(CONNECT_RETRY_S)
            socks.append(sock)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def query_round(socks: list[socket.socket], response_bytes: int, timeout_s: float,
                scratch: memoryview | None = None) -> dict:
    """One query: the same request to every server back to back, then every response read
    as it arrives. Times in seconds from just before the first request: ``flow_s`` per
    server (in ``socks`` order), ``round_s`` (the last flow) and ``send_spread_s`` (how far
    apart the first and last request left). RoundTimeout after ``timeout_s``."""
    request = encode_request(response_bytes)
    scratch = scratch if scratch is not None else memoryview(bytearray(RECV_CHUNK_BYTES))
    remaining = [response_bytes] * len(socks)
    flow_s: list[float | None] = [None] * len(socks)
    start = time.monotonic()
    for sock in socks:
        sock.sendall(request)
    send_spread_s = time.monotonic() - start
    deadline = start + timeout_s
    with selectors.DefaultSelector() as selector:
        for index, sock in enumerate(socks):
            selector.register(sock, selectors.EVENT_READ, index)
        pending = len(socks)
        while pending:
            wait_s = deadline - time.monotonic()
            events = selector.select(timeout=max(0.0, wait_s)) if wait_s > 0 else []
            if not events and time.monotonic() >= deadline:
                late = [i for i, t in enumerate(flow_s) if t is None]
                raise RoundTimeout(f"{len(late)} of {len(socks)} responses incomplete after "
                                   f"{timeout_s:g} s (servers {late})")
            for key, _ in events:
                index = key.data
                n = key.fileobj.recv_into(scratch, min(len(scratch), remaining[index]))
                if n == 0:
                    raise ConnectionError(f"server {index} closed the connection with "
                                          f"{remaining[index]} bytes of its response unsent")
                remaining[index] -= n
                if remaining[index] == 0:
                    flow_s[index] = time.monotonic() - start
                    selector.unregister(key.fileobj)
                    pending -= 1
    return {"start_monotonic_s": start, "send_spread_s": send_spread_s, "flow_s": flow_s,
            "round_s": max(flow_s)}


def query(servers: list[tuple[str, int]], response_bytes: int, rounds: int, gap_s: float,
          dscp: int, round_timeout_s: float = DEFAULT_ROUND_TIMEOUT_S,
          connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, warmup: int = 0,
          warmed=None) -> dict:
    """``warmup`` queries, kept apart in ``warmup_rounds``, then ``rounds`` synchronised
    queries to ``servers``, all ``gap_s`` apart; the result as plain data. A round that
    fails ends the rounds; ``error`` says why (rounds counted from the first warm-up).
    ``warmed``, if given, is called once the warm-up queries are done (and the gap after
    them has passed), before the first recorded one."""
    encode_request(response_bytes)  # a bad size is the caller's error, not a failed round
    result: dict = {"servers": [f"{ip}:{port}" for ip, port in servers],
                    "response_bytes": response_bytes, "dscp": dscp, "gap_s": gap_s,
                    "connect_s": None, "warmup_rounds": [], "rounds": [], "error": None}
    t0 = time.monotonic()
    try:
        socks = connect_all(servers, dscp, connect_timeout_s)
    except OSError as exc:
        result["error"] = f"connect: {exc}"
        return result
    result["connect_s"] = time.monotonic() - t0
    scratch = memoryview(bytearray(RECV_CHUNK_BYTES))
    try:
        for index in range(warmup + rounds):
            if index:
                time.sleep(gap_s)
            if index == warmup and warmed is not None:
                warmed()
            try:
                done = query_round(socks, response_bytes, round_timeout_s, scratch)
            except (RoundTimeout, OSError) as exc:
                result["error"] = f"round {index}: {exc}"
                break
            result["warmup_rounds" if index < warmup else "rounds"].append(done)
    finally:
        for sock in socks:
            sock.close()
    return result


def hold_for_caller() -> None:
    """Say the warm-up is over and wait until the caller answers (one line on stdin)."""
    print(WARMED_LINE, flush=True)
    sys.stdin.readline()


def parse_servers(text: str, default_port: int | None) -> list[tuple[str, int]]:
    """``"10.1.0.2,10.2.0.2:5601"`` -> [("10.1.0.2", default_port), ("10.2.0.2", 5601)]."""
    servers = []
    for item in text.split(","):
        host, sep, port = item.strip().partition(":")
        if not host:
            raise ValueError(f"empty server in {text!r}")
        if sep:
            servers.append((host, int(port)))
        elif default_port is None:
            raise ValueError(f"server {host} has no port and no --port was given")
        else:
            servers.append((host, default_port))
    return servers


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve", help="answer requests (on each sender)")
    s.add_argument("--bind", default="0.0.0.0")
    s.add_argument("--port", type=int, required=True, help="TCP port (0: any free one)")
    s.add_argument("--dscp", type=int, default=0)
    s.add_argument("--connections", type=int, default=None,
                   help="exit after serving this many connections to their end")
    q = sub.add_parser("query", help="run synchronised queries (on the receiver)")
    q.add_argument("--servers", required=True, help="comma-separated IP or IP:port")
    q.add_argument("--port", type=int, default=None, help="port of servers given without one")
    q.add_argument("--response-bytes", type=int, required=True)
    q.add_argument("--rounds", type=int, default=1)
    q.add_argument("--warmup", type=int, default=0, help="queries before the recorded rounds")
    q.add_argument("--gap-s", type=float, default=0.0)
    q.add_argument("--dscp", type=int, default=0)
    q.add_argument("--round-timeout-s", type=float, default=DEFAULT_ROUND_TIMEOUT_S)
    q.add_argument("--connect-timeout-s", type=float, default=DEFAULT_CONNECT_TIMEOUT_S)
    q.add_argument("--hold-after-warmup", action="store_true",
                   help=f"after the warm-up, print {WARMED_LINE!r} and wait for a line on "
                        "stdin (the caller reads its counters in between)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "serve":
        with open_listener(args.bind, args.port, args.dscp) as listener:
            print(json.dumps({"listening_port": listener.getsockname()[1]}), flush=True)
            serve(listener, args.dscp, args.connections)
        return 0
    result = query(parse_servers(args.servers, args.port), args.response_bytes, args.rounds,
                   args.gap_s, args.dscp, args.round_timeout_s, args.connect_timeout_s,
                   args.warmup, hold_for_caller if args.hold_after_warmup else None)
    print(json.dumps(result), flush=True)
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
