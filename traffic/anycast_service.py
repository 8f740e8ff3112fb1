"""A request/response service behind an anycast address, like an inference endpoint: every
replica answers each request with its own name, so a client's log shows which replica served
it, request by request.

    python -m testbed.traffic.anycast_service serve --bind 10.255.0.1 --port 7000 --name p0e0h0
    python -m testbed.traffic.anycast_service probe --service 10.255.0.1 --port 7000 \\
        --interval-s 0.01 --duration-s 6

``probe`` sends one UDP request every ``interval_s`` and prints one JSON line per answer:
{"t_monotonic_s", "seq", "replica"}; CLOCK_MONOTONIC is shared by every process on the
machine, so the lines line up with a failure injected by the testbed.
"""
from __future__ import annotations

import argparse
import json
import select
import socket
import sys
import time

REQUEST_BYTES = 64


def serve(bind_ip: str, port: int, name: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((bind_ip, port))
        while True:
            data, peer = sock.recvfrom(REQUEST_BYTES)
            sock.sendto(json.dumps({"seq": int(data), "replica": name}).encode(), peer)


def probe(service_ip: str, port: int, interval_s: float, duration_s: float, out=sys.stdout) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        start = time.monotonic()
        next_send, seq = start, 0
        while True:
            now = time.monotonic()
            if now - start >= duration_s + interval_s * 10:
                return
            if now >= next_send and now - start < duration_s:
                try:
                    sock.sendto(str(seq).encode(), (service_ip, port))
                except OSError:
                    pass  # no route for a moment: the request is lost, as it would be
                seq += 1
                next_send += interval_s
            ready, _, _ = select.select([sock], [], [], max(0.0, next_send - time.monotonic()))
            if ready:
                reply = json.loads(sock.recv(256))
                print(json.dumps({"t_monotonic_s": time.monotonic(), **reply}), file=out,
                      flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--name", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--service", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--interval-s", type=float, default=0.01)
    p.add_argument("--duration-s", type=float, required=True)
    args = ap.parse_args(argv)
    if args.mode == "serve":
        serve(args.bind, args.port, args.name)
    else:
        probe(args.service, args.port, args.interval_s, args.duration_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
