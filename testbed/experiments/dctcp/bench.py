"""The DCTCP micro-benchmark's pure parts on the one-switch bench (testbed.model.bench, its
bottleneck port queued at rate_mbit, buffer and K): the hosts' TCP, the judged window, and
the queue samples summarised. Every sender runs one long TCP flow into the receiver, so the
switch port toward the receiver is the bottleneck and the only queue that builds.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from testbed.measure.stats import percentile
from testbed.plan.settings import DEFAULT_SAMPLE_MS, SYSCTL_TCP_ECN

DROPTAIL, ECN = "droptail", "ecn"
QUEUEINGS = (DROPTAIL, ECN)
QUEUEING_NAMES = {DROPTAIL: "drop-tail", ECN: "ECN"}
DROPTAIL_CCS = ("cubic", "reno")  # the loss-based TCP the drop-tail baseline runs
TCP_ECN_OFF = "0"  # neither request nor accept ECN
# The drop-tail hosts turn ECN off outright: a new namespace's default (2) would still
# accept it.
DROPTAIL_SYSCTLS = {SYSCTL_TCP_ECN: TCP_ECN_OFF}
QUEUE_SAMPLE_MS = DEFAULT_SAMPLE_MS  # 10 ms, as mininet-tests/dctcp sampled
END_MARGIN_S = 0.5  # left out at the end of the judged window: the flows wind down
# Linux never lets a window fall below 2 segments (ssthresh floor, also dctcp_ssthresh),
# so N flows keep about 2N segments in flight however many marks they see.
MIN_CWND_SEGMENTS = 2
QUEUE_FILE = "queue.json"  # one setup's queue samples, in its folder


def setup_name(senders: int, queueing: str) -> str:
    """``n2-droptail``, ``n8-ecn``: a setup's name, and its folder."""
    return f"n{senders}-{queueing}"


def tcp_label(tcp: dict) -> str:
    """``cubic``, ``cubic+ecn`` or ``dctcp`` (which brings its own ECN)."""
    cc = tcp.get("congestion_control") or "default"
    return f"{cc}+ecn" if tcp.get("ecn") and cc != "dctcp" else cc


# --- the judged window ------------------------------------------------------------------------


def judged_window_s(omit_s: int, seconds: int) -> tuple[float, float]:
    """The judged window, in seconds since the flows started: after TCP start-up, until
    just before the flows end (iperf3 runs ``omit_s`` + ``seconds``)."""
    return float(omit_s), omit_s + seconds - END_MARGIN_S


def window_samples(t_s: Sequence[float], depth_bytes: Sequence[int],
                   window_s: Sequence[float]) -> tuple[list[float], list[int]]:
    """The samples taken inside ``window_s`` (both in seconds since the flows started)."""
    start, end = window_s
    kept = [(t, d) for t, d in zip(t_s, depth_bytes) if start <= t <= end]
    return [t for t, _ in kept], [d for _, d in kept]


def summarise_queue(t_s: Sequence[float], depth_bytes: Sequence[int],
                    window_s: Sequence[float], mtu_bytes: int) -> dict:
    """Median, p95, max and mean of the queue inside the window, in bytes and in packets of
    ``mtu_bytes``, with the sampling interval achieved and the fraction of the expected
    samples taken (None statistics without samples)."""
    times, depths = window_samples(t_s, depth_bytes, window_s)
    expected = max(1, round((window_s[1] - window_s[0]) * 1000 / QUEUE_SAMPLE_MS))
    summary: dict = {"samples": len(depths), "sampled_fraction": len(depths) / expected,
                     "interval_ms_mean": ((times[-1] - times[0]) * 1000 / (len(times) - 1)
                                          if len(times) > 1 else None)}
    stats = ({"median": percentile(depths, 50), "p95": percentile(depths, 95),
              "max": max(depths), "mean": sum(depths) / len(depths)} if depths
             else dict.fromkeys(("median", "p95", "max", "mean")))
    for name, value in stats.items():
        summary[f"{name}_bytes"] = value
        summary[f"{name}_packets"] = None if value is None else value / mtu_bytes
    return summary


def window_floor_bytes(senders: int, mtu_bytes: int, rate_mbit: float,
                       rtt_s: float | None) -> float:
    """The queue ``senders`` flows hold when every one is at Linux's smallest window: their
    segments in flight beyond what the path itself holds (its bandwidth-delay product at
    ``rtt_s``, taken as 0 when unknown). Marking cannot push the queue below it."""
    bdp_bytes = rate_mbit * 1e6 / 8 * (rtt_s or 0.0)
    return max(0.0, senders * MIN_CWND_SEGMENTS * mtu_bytes - bdp_bytes)


PING_RTT = re.compile(r"=\s*([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)\s*ms")


def parse_ping_rtt_ms(text: str) -> dict | None:
    """min/avg/max RTT in ms from ``ping -q`` output; None when nothing was answered."""
    match = PING_RTT.search(text)
    if match is None:
        return None
    low, avg, high, _ = (float(x) for x in match.groups())
    return {"min_ms": low, "avg_ms": avg, "max_ms": high}


# --- the samples' file ------------------------------------------------------------------------


def write_queue_samples(path: Path, t_s: Sequence[float], qdisc_bytes: Sequence[int],
                        marker_bytes: Sequence[int] | None, read_s: Sequence[float]) -> None:
    """One setup's samples: seconds since the flows started, the buffer qdisc's real
    backlog, the eBPF marker's model of it at the same instants (None on the RED path,
    where the qdisc is the only queue), and how long each read took."""
    path.write_text(json.dumps({
        "t_s": list(t_s), "qdisc_bytes": list(qdisc_bytes),
        "marker_bytes": None if marker_bytes is None else list(marker_bytes),
        "read_s": list(read_s)}))


def read_queue_samples(path: Path) -> dict:
    return json.loads(path.read_text())
