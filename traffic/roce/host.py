"""The program run inside an emulated host: one side of a RoCEv2 RC connection.

    python -m testbed.traffic.roce.host serve --bind 10.0.0.2
    python -m testbed.traffic.roce.host send  --bind 10.0.0.1 --peer 10.0.0.2 \\
        --opcode write --size 1048576 --count 100 --cc dcqcn --link-rate-mbit 100

``serve`` waits on the TCP side channel for ``--connections`` senders (one by default; more
for an incast onto one UDP port); for each it takes the transport settings from the sender's
hello (opcode, message size, path MTU, congestion control), registers a memory region, and
answers with its QPN, PSN and R_Key. It keeps the engine running until every sender has said
it is done, answering each with the hash of its region and its counters, then prints one JSON
line with every connection's result and exits. ``send`` connects, sends ``--count`` messages (or for
``--duration-s``) keeping ``--queue-depth`` work requests posted, and prints one JSON line:
bytes delivered, goodput, messages, retransmissions, NAKs, timeouts, CNPs, the SHA-256 of
both regions (data verified when equal) and the congestion control's time series.

Message i uses slot i mod ``slots`` of the sender's region (random bytes from ``--seed``) and
lands in the same slot of the receiver's (RDMA WRITE to that address; SEND into a receive
posted on that slot, receives being consumed in order), so after the run the written slots
of both regions must hash the same.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time

import numpy as np

from . import cc as ccmod
from . import rc, wire
from .engine import CONTROL_DSCP, DATA_DSCP, Engine, EngineConfig, FaultHooks, SideChannel
from .verbs import (CompletionQueue, MemoryRegion, ProtectionDomain, QPConfig, QPInfo,
                    QueuePair, RecvWR, SendWR, WcStatus, WrOpcode)

SIDE_CHANNEL_PORT = 18515          # perftest's default port
REGION_CAP_BYTES = 64 << 20        # slots are added while the region stays below this
RECV_DEPTH = 64                    # receives the server keeps posted for SEND
SIDE_CHANNEL_CHECK_S = 0.02        # how often the server looks at the side channel
SERIES_MAX_POINTS = 2000           # rows of a time series printed (thinned evenly beyond)
OPCODES = {"write": WrOpcode.RDMA_WRITE, "send": WrOpcode.SEND}


def parse_overrides(items: list[str]) -> dict[str, float]:
    """``["g=0.0039", "rai_bps=1e6"]`` -> {"g": 0.0039, "rai_bps": 1e6}."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--cc-param wants name=value, got {item!r}")
        out[name.strip()] = float(value)
    return out


def slot_count(message_bytes: int, count: int | None, region_cap_bytes: int) -> int:
    """Slots in the region: one per message up to ``count``, while under the cap."""
    fit = max(1, region_cap_bytes // max(message_bytes, 1))
    return max(1, min(fit, count)) if count else fit


def region_digest(mr: MemoryRegion, message_bytes: int, slots_written: int) -> str:
    return hashlib.sha256(mr.view[:message_bytes * slots_written]).hexdigest()


def relative_series(summary: dict | None, origin_s: float, max_points: int) -> dict | None:
    """A machine's summary with its series' times counted from ``origin_s`` and thinned."""
    if summary is None:
        return None
    series = dict(summary["series"])
    series["t_s"] = [t - origin_s for t in series["t_s"]]
    return {**summary, "series": downsample(series, max_points)}


def downsample(series: dict[str, list], max_points: int) -> dict[str, list]:
    """Every k-th row (and the last) so that at most about ``max_points`` rows remain."""
    rows = len(next(iter(series.values()), []))
    if rows <= max_points:
        return series
    step = math.ceil(rows / max_points)
    keep = list(range(0, rows, step)) + ([rows - 1] if (rows - 1) % step else [])
    return {name: [values[i] for i in keep] for name, values in series.items()}


def json_safe(value):
    """Replace non-finite floats (not JSON) by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def transport_settings(args: argparse.Namespace) -> dict:
    """What the sender tells the server in its hello, so both ends agree."""
    return {"opcode": args.opcode, "message_bytes": args.size, "mtu_bytes": args.mtu,
            "slots": slot_count(args.size, args.count, args.region_cap_bytes),
            "cc": args.cc, "cc_params": parse_overrides(args.cc_param),
            "link_rate_bps": args.link_rate_mbit * 1e6 if args.link_rate_mbit else None,
            "ack_every": args.ack_every}


def qp_config(settings: dict, args: argparse.Namespace) -> QPConfig:
    """The QP attributes both sides use: the NP (CNP interval, scaled with the link) when the
    control is DCQCN, the ECN echo when it is DCTCP."""
    cnp_interval_s = None
    if settings["cc"] == "dcqcn":
        params, _ = ccmod.params_for_link(settings["link_rate_bps"])
        cnp_interval_s = settings["cc_params"].get("cnp_interval_s", params.cnp_interval_s)
    return QPConfig(path_mtu_bytes=settings["mtu_bytes"], ack_request_every=settings["ack_every"],
                    ack_every=settings["ack_every"], ack_timeout_s=args.ack_timeout_s,
                    retry_count=args.retry_count, max_outstanding_packets=args.max_outstanding,
                    ecn_echo=settings["cc"] == "dctcp", cnp_interval_s=cnp_interval_s)


def open_engine(args: argparse.Namespace) -> Engine:
    config = EngineConfig(local_ip=args.bind, port=args.port, data_dscp=args.data_dscp,
                          control_dscp=args.control_dscp, ecn_capable=not args.no_ecn,
                          verify_icrc=not args.no_icrc_check, pacing_burst_s=args.pacing_burst_s)
    hooks = FaultHooks(drop_probability=args.drop_probability,
                       ce_mark_probability=args.ce_mark_probability, seed=args.seed)
    return Engine(config, hooks)


class ServedConnection:
    """One sender's QP on the serving engine: the hello, its region and receives, and the
    side channel on which it says it is done."""

    def __init__(self, engine: Engine, chan: SideChannel, args: argparse.Namespace):
        self.engine, self.chan = engine, chan
        self.created_s = engine.clock()
        hello = chan.recv()
        settings = hello["settings"]
        self.size, self.slots = settings["message_bytes"], settings["slots"]
        self.opcode = settings["opcode"]
        pd = ProtectionDomain(engine)
        self.mr = MemoryRegion(pd, self.size * self.slots)
        self.cq = CompletionQueue(RECV_DEPTH * 4)
        self.qp = QueuePair(pd, self.cq, self.cq, qp_config(settings, args))
        self.qp.to_init()
        self.posted = 0
        if self.opcode == "send":
            for _ in range(RECV_DEPTH):
                self._post_recv()
        self.qp.to_rtr(QPInfo.from_dict(hello["info"]))
        self.qp.to_rts()
        chan.send({"info": self.qp.local_info(self.mr).to_dict()})
        self.errors: list[str] = []
        self.result: dict | None = None

    def _post_recv(self) -> None:
        slot = self.posted % self.slots
        self.qp.post_recv(RecvWR(self.posted, self.mr, slot * self.size, self.size))
        self.posted += 1

    def poll(self) -> None:
        """Take receive completions and post a receive for each."""
        for wc in self.cq.poll(RECV_DEPTH):
            if wc.status is not WcStatus.SUCCESS:
                self.errors.append(wc.status.name)
            self._post_recv()

    def check_done(self) -> bool:
        """If the sender said it is done: hash the written slots, answer, keep the result."""
        if self.result is not None or not self.chan.readable():
            return False
        done = self.chan.recv()
        written = min(done["messages"], self.slots)
        self.result = json_safe({
            "sha256": region_digest(self.mr, self.size, written), "slots_hashed": written,
            "opcode": self.opcode, "message_bytes": self.size, "errors": self.errors,
            "qp": self.engine.qp_stats(self.qp),
            "np": relative_series(self.qp.np.summary() if self.qp.np is not None else None,
                                  self.created_s, SERIES_MAX_POINTS),
            "series_origin_monotonic_s": self.created_s})
        self.chan.send({"result": self.result})
        return True


def serve(args: argparse.Namespace) -> dict:
    """Serve ``--connections`` senders on one engine (one UDP port, one QP each), until each
    has said it is done or nothing has happened for ``--timeout-s``."""
    served: list[ServedConnection] = []
    errors: list[str] = []
    with open_engine(args) as engine, SideChannel.listen(args.bind, args.side_port) as listener:
        last_event = next_check = time.monotonic()
        try:
            while True:
                engine.progress(SIDE_CHANNEL_CHECK_S)
                for connection in served:
                    connection.poll()
                now = time.monotonic()
                if now < next_check:
                    continue
                next_check = now + SIDE_CHANNEL_CHECK_S
                if len(served) < args.connections:
                    chan = SideChannel.accept_ready(listener, args.timeout_s)
                    if chan is not None:
                        served.append(ServedConnection(engine, chan, args))
                        last_event = now
                if any([c.check_done() for c in served]):
                    last_event = now
                if len(served) == args.connections and all(c.result for c in served):
                    break
                if now - last_event > args.timeout_s:
                    errors.append("timeout")
                    break
        finally:
            for connection in served:
                connection.chan.close()
        return {"role": "serve", "connections": [c.result for c in served], "errors": errors,
                "engine": dict(engine.stats)}


def send(args: argparse.Namespace) -> dict:
    settings = transport_settings(args)
    size, slots, opcode = args.size, settings["slots"], OPCODES[args.opcode]
    with open_engine(args) as engine:
        pd = ProtectionDomain(engine)
        mr = MemoryRegion(pd, buffer=np.random.default_rng(args.seed).integers(
            0, 256, size * slots, dtype=np.uint8))
        cq = CompletionQueue(args.queue_depth * 4)
        chan = SideChannel.connect(args.peer, args.side_port, args.timeout_s)
        try:
            origin_s = engine.clock()   # series count from here: the peer is up, data follows
            control, scaling = ccmod.make(args.cc, link_rate_bps=settings["link_rate_bps"],
                                          mtu_bytes=args.mtu, overrides=settings["cc_params"],
                                          now_s=origin_s)
            qp = QueuePair(pd, cq, cq, qp_config(settings, args), cc=control)
            qp.to_init()
            chan.send({"settings": settings, "info": qp.local_info(mr).to_dict()})
            remote = QPInfo.from_dict(chan.recv()["info"])
            qp.to_rtr(remote)
            qp.to_rts()
            run = _drive(engine, qp, cq, mr, remote, opcode, size, slots, args)
            chan.send({"done": True, "messages": run["messages"]})
            receiver = chan.recv()["result"]
        finally:
            chan.close()
        written = min(run["messages"], slots)
        local_digest = region_digest(mr, size, written)
        stats = engine.qp_stats(qp)
        summary = relative_series(control.summary(), origin_s, args.series_max_points)
        summary["scaling"] = [vars(s) for s in scaling]
        return {
            "role": "send", "opcode": args.opcode, "message_bytes": size, "mtu_bytes": args.mtu,
            "messages": run["messages"], "bytes_delivered": run["messages"] * size,
            "elapsed_s": run["elapsed_s"], "window_monotonic_s": run["window_monotonic_s"],
            "series_origin_monotonic_s": origin_s,
            "goodput_mbit": run["messages"] * size * 8 / run["elapsed_s"] / 1e6
            if run["elapsed_s"] > 0 else 0.0,
            "packets_sent": stats.get("packets_sent", 0),
            "retransmitted_packets": stats.get("retransmitted_packets", 0),
            "naks": stats.get("naks_received", 0), "timeouts": stats.get("timeouts", 0),
            "cnps_received": qp.cnps_received,
            "cnps_sent_by_receiver": receiver["qp"]["cnps_sent"],
            "sha256_sender": local_digest, "sha256_receiver": receiver["sha256"],
            "data_verified": local_digest == receiver["sha256"] and not run["errors"],
            "errors": run["errors"], "cc": summary, "qp": stats, "engine": dict(engine.stats),
            "receiver": receiver,
        }


def _drive(engine: Engine, qp: QueuePair, cq: CompletionQueue, mr: MemoryRegion,
           remote: QPInfo, opcode: WrOpcode, size: int, slots: int,
           args: argparse.Namespace) -> dict:
    """Post messages (``--count`` or for ``--duration-s``) with ``--queue-depth`` outstanding
    and collect their completions."""
    posted = completed = succeeded = 0
    errors: list[str] = []
    start = time.monotonic()
    stop_posting_s = start + args.duration_s if args.duration_s else math.inf
    give_up_s = start + args.timeout_s + (args.duration_s or 0)
    last_done = start
    while True:
        now = time.monotonic()
        more = (posted < args.count) if args.count else now < stop_posting_s
        while more and posted - completed < args.queue_depth and not qp.in_error:
            slot = posted % slots
            qp.post_send(SendWR(posted, opcode, mr, slot * size, size,
                                remote_addr=remote.mr_addr + slot * size, rkey=remote.rkey))
            posted += 1
            more = (posted < args.count) if args.count else time.monotonic() < stop_posting_s
        if completed == posted and not more:
            break
        if qp.in_error and not len(cq):
            break
        if now > give_up_s:
            errors.append("timeout")
            break
        engine.progress(engine.config.max_idle_wait_s)
        for wc in cq.poll(args.queue_depth):
            completed += 1
            last_done = time.monotonic()
            if wc.status is WcStatus.SUCCESS:
                succeeded += 1
            else:
                errors.append(wc.status.name)
    return {"messages": succeeded, "elapsed_s": last_done - start, "errors": errors,
            "window_monotonic_s": [start, last_done]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.traffic.roce.host",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("serve", "send"):
        p = sub.add_parser(role)
        p.add_argument("--bind", required=True, help="this host's IPv4 address (RoCEv2 GID)")
        p.add_argument("--port", type=int, default=wire.ROCE_UDP_PORT, help="UDP port (4791)")
        p.add_argument("--side-port", type=int, default=SIDE_CHANNEL_PORT,
                       help="TCP port of the set-up side channel (on the server)")
        p.add_argument("--data-dscp", type=int, default=DATA_DSCP)
        p.add_argument("--control-dscp", type=int, default=CONTROL_DSCP)
        p.add_argument("--no-ecn", action="store_true", help="send data Not-ECT")
        p.add_argument("--no-icrc-check", action="store_true")
        p.add_argument("--pacing-burst-s", type=float, default=EngineConfig.pacing_burst_s,
                       help="token bucket depth as time at the paced rate (catch-up after a stall)")
        p.add_argument("--ack-timeout-s", type=float,
                       default=rc.timeout_s_from_code(rc.DEFAULT_TIMEOUT_CODE))
        p.add_argument("--retry-count", type=int, default=7)
        p.add_argument("--max-outstanding", type=int, default=128,
                       help="packets in flight per QP at most")
        p.add_argument("--timeout-s", type=float, default=60.0,
                       help="give up waiting for the peer or for completions")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--drop-probability", type=float, default=0.0,
                       help="test hook: drop this fraction of sent packets")
        p.add_argument("--ce-mark-probability", type=float, default=0.0,
                       help="test hook: send this fraction of data packets CE-marked")
        if role == "send":
            p.add_argument("--peer", required=True, help="the server's IPv4 address")
            p.add_argument("--opcode", choices=sorted(OPCODES), default="write")
            p.add_argument("--size", type=int, default=65536, help="message bytes")
            amount = p.add_mutually_exclusive_group()
            amount.add_argument("--count", type=int, default=None, help="messages to send")
            amount.add_argument("--duration-s", type=float, default=None)
            p.add_argument("--mtu", type=int, choices=wire.PATH_MTUS, default=1024)
            p.add_argument("--cc", choices=ccmod.NAMES, default="none")
            p.add_argument("--cc-param", action="append", default=[], metavar="NAME=VALUE",
                           help="override a congestion-control parameter (repeatable)")
            p.add_argument("--link-rate-mbit", type=float, default=None,
                           help="the emulated link rate: pacing of 'none', scaling of DCQCN")
            p.add_argument("--ack-every", type=int, default=16,
                           help="ack-request bit and ACK coalescing every N packets")
            p.add_argument("--queue-depth", type=int, default=16,
                           help="send work requests kept posted")
            p.add_argument("--region-cap-bytes", type=int, default=REGION_CAP_BYTES)
            p.add_argument("--series-max-points", type=int, default=SERIES_MAX_POINTS)
        else:
            p.add_argument("--connections", type=int, default=1,
                           help="senders to serve on this engine (one QP each), e.g. an incast")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.role == "send":
        if args.cc == "dcqcn" and not args.link_rate_mbit:
            parser.error("--cc dcqcn needs --link-rate-mbit (its rates and timers scale with it)")
        if not (args.count or args.duration_s):
            args.count = 1
    result = serve(args) if args.role == "serve" else send(args)
    json.dump(json_safe(result), sys.stdout)
    sys.stdout.write("\n")
    return 0 if args.role == "serve" or result["data_verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
