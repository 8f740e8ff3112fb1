"""The DCTCP micro-benchmark: N long TCP flows into one receiver through one switch port,
drop-tail against ECN marking at K, with the port's queue sampled every 10 ms.

    sender l0h0     --\\
    sender l0h1     ---+-- l0 --(l0-eth{N+1}: rate_mbit, buffer, K)--> l0h{N} receiver
    ...                |
    sender l0h{N-1} --/    (l0's uplink to spine s0 carries nothing)

The switch is testbed.model.topology.spineleaf with one leaf and one spine, the non-blocking
single switch testbed.experiments.hedera.run uses too. For every N in ``senders`` two configurations run,
each on a fabric of its own (hosts set their TCP when they start):

- drop-tail: the port's byte buffer alone; hosts run loss-based TCP (``droptail_cc``,
  cubic by default) with ECN off (net.ipv4.tcp_ecn=0);
- ECN: the same buffer with a step mark at K (``k_bytes``, or DCTCP's anchors scaled to the
  link rate by testbed.plan.scaling); hosts run the best congestion control the kernel has
  with ECN (``ecn_cc`` auto: dctcp where it exists, else cubic with classic ECN; the
  results record which).

Measured per configuration, over the judged window (after ``omit_s`` seconds of TCP
start-up, until just before the flows end): the bottleneck queue's median, p95 and max in
bytes and in MTU-sized packets (the marker's samples, testbed.measure.queues.queue_sampling),
the bottleneck's utilisation (its switch-side TX counter, testbed.measure.telemetry), marks and
drops at the port, each flow's goodput (iperf3, as testbed.experiments.hedera.run runs flows) and their
Jain index, and whether the emulator kept up (testbed.measure.fidelity).

Published results beside ours (/work/shared/ANCHORS.md): DCTCP's K = 20 packets at
1 Gbit/s and 65 at 10 Gbit/s; the Mininet-HiFi reproduction (2 senders, 100 Mbit/s, a
425-packet queue, i.e. 51 ms: the default buffer here is 50 ms at the link rate) where DCTCP
held the queue near K while TCP filled the buffer; the claim that marking keeps the median
queue near K with utilisation >= 90%.

Results go to ``results/<run-id>/``: summary.json (results, verdict, published numbers),
one folder per configuration (fabric files, queue.json with its samples), queue_time.png
and queue_cdf.png; ``plot_dctcp`` redraws both from those files.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.errors import ConfigError, TestbedError
from testbed.measure.stats import percentile
from testbed.model.topology.base import Fabric, intf_name
from testbed.model.topology.checks import check_count, check_rate
from testbed.model.topology.spineleaf import spine_leaf
from testbed.plan.profiles import QueueConfig, check_bytes
from testbed.plan.settings import (
    DEFAULT_SAMPLE_MS,
    SYSCTL_TCP_ECN,
    TCP_CC_CHOICES,
    EcnSettings,
    TcpSettings,
    ecn_settings,
)

DROPTAIL, ECN = "droptail", "ecn"
QUEUEINGS = (DROPTAIL, ECN)
DROPTAIL_CCS = ("cubic", "reno")  # the loss-based TCP the drop-tail baseline runs
TCP_ECN_OFF = "0"  # neither request nor accept ECN
# Rates up to the Mininet-HiFi reproduction's 100 Mbit/s. PLATFORM.md measured 484 Mbit/s
# of TCP through two userspace switches at MTU 1500; N senders' bursts arrive at up to N
# times the port rate, and every sampled read of the queue costs CPU too.
MAX_RATE_MBIT = 100.0
# Two iperf3 processes per flow on a 2-core machine, one host link each on the one switch.
MAX_SENDERS = 32
MIN_SECONDS, MAX_SECONDS = 5, 600
MAX_OMIT_S = 60
MIN_MTU_BYTES, MAX_MTU_BYTES = 576, 9000  # as testbed.experiments.allreduce.run.RunConfig
MIN_BUFFER_FRAMES = 4  # a buffer of fewer full frames leaves no room between K and full
QUEUE_SAMPLE_MS = DEFAULT_SAMPLE_MS  # 10 ms, as mininet-tests/dctcp sampled
END_MARGIN_S = 0.5  # left out at the end of the judged window: the flows wind down
PROGRESS_EVERY_S = 5.0
PING_COUNT = 5
PING_INTERVAL_S = 0.2

# Named tolerances of the verdict.
# Drop-tail: cubic backs off to 0.7 of its window on a loss and the bandwidth-delay product
# is a small part of a 50 ms buffer, so its queue saws between about 0.7 of the buffer and
# the buffer; half the buffer leaves room for synchronised losses and for reno (0.5).
DROPTAIL_MEDIAN_MIN_FRACTION = 0.5
# ECN: senders react one RTT after a mark, so the queue rides a few frames above K.
ECN_MEDIAN_TOLERANCE_FRAMES = 3
ECN_MIN_UTILISATION = 0.90  # the DCTCP claim: full throughput with the short queue
# The sampler must deliver at least this fraction of the samples the window holds at
# QUEUE_SAMPLE_MS, or its statistics describe too few instants.
MIN_SAMPLED_FRACTION = 0.5
# Linux never lets a window fall below 2 segments (ssthresh floor, also dctcp_ssthresh),
# so N flows keep about 2N segments in flight however many marks they see.
MIN_CWND_SEGMENTS = 2

PUBLISHED = (
    {"source": "DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257)",
     "statement": "mark CE above K; K = 20 packets at 1 Gbit/s, 65 at 10 Gbit/s; K > C*RTT/7"},
    {"source": "Mininet-HiFi reproduction (Handigol et al., CoNEXT 2012)",
     "statement": "2 senders -> 1 receiver, 100 Mbit/s, 425-packet queue: DCTCP holds the "
                  "queue near K while TCP fills the buffer"},
    {"source": "DCTCP claim",
     "statement": "ECN marking keeps the median queue near K while utilisation stays >= 90%"},
)


# --- configuration ----------------------------------------------------------------------------


@dataclass
class DctcpConfig:
    """What to run. ``k_bytes`` None: K from DCTCP's anchors scaled to ``rate_mbit``
    (``rtt_s``, the path's RTT, then also enforces K > C*RTT/7); ``buffer_bytes`` None:
    ``testbed.apply.network.default_buffer_bytes`` (50 ms at the rate)."""

    rate_mbit: float = 20.0
    senders: tuple[int, ...] = (2, 8)
    seconds: int = 30
    omit_s: int = 5
    k_bytes: int | None = None
    buffer_bytes: int | None = None
    rtt_s: float | None = None
    mtu_bytes: int = 1500  # DCTCP counts K in packets of a standard Ethernet MTU
    droptail_cc: str = "cubic"
    ecn_cc: str = "auto"
    results_dir: str = "results"

    def validate(self) -> None:
        check_rate("rate_mbit", self.rate_mbit)
        if self.rate_mbit > MAX_RATE_MBIT:
            raise ConfigError("rate_mbit", f"must be at most {MAX_RATE_MBIT:g} (what one "
                              f"userspace switch forwards with room to spare), got "
                              f"{self.rate_mbit!r}")
        if not isinstance(self.senders, (tuple, list)) or not self.senders:
            raise ConfigError("senders", f"must list sender counts such as (2, 8), "
                              f"got {self.senders!r}")
        for n in self.senders:
            check_count("senders", n, 1, MAX_SENDERS)
        if len(set(self.senders)) != len(self.senders):
            raise ConfigError("senders", f"lists a count twice: {list(self.senders)}")
        check_count("seconds", self.seconds, MIN_SECONDS, MAX_SECONDS)
        check_count("omit_s", self.omit_s, 0, MAX_OMIT_S)
        check_count("mtu_bytes", self.mtu_bytes, MIN_MTU_BYTES, MAX_MTU_BYTES)
        if self.buffer_bytes is not None:
            check_bytes("buffer_bytes", self.buffer_bytes,
                        minimum=MIN_BUFFER_FRAMES * self.mtu_bytes)
        if self.rtt_s is not None and self.k_bytes is not None:
            raise ConfigError("rtt_s", "raises a K scaled from the anchors (K > C*RTT/7); "
                              "it does not apply with k_bytes")
        if self.droptail_cc not in DROPTAIL_CCS:
            raise ConfigError("droptail_cc", f"must be one of {', '.join(DROPTAIL_CCS)} "
                              f"(loss-based TCP), got {self.droptail_cc!r}")
        if self.ecn_cc not in TCP_CC_CHOICES:
            raise ConfigError("ecn_cc", f"must be one of {', '.join(TCP_CC_CHOICES)}, "
                              f"got {self.ecn_cc!r}")
        self.ecn_settings()

    def resolved_buffer_bytes(self) -> int:
        from testbed.apply.network import default_buffer_bytes

        if self.buffer_bytes is not None:
            return self.buffer_bytes
        return default_buffer_bytes(self.rate_mbit, self.mtu_bytes)

    def ecn_settings(self) -> EcnSettings:
        """The marked queue (testbed.plan.settings): a step at ``k_bytes``, or the dctcp
        scheme scaled to the rate; errors name this config's own fields."""
        section: dict = {"buffer_bytes": self.resolved_buffer_bytes(),
                         "sample_ms": QUEUE_SAMPLE_MS}
        if self.k_bytes is not None:
            section.update(profile="step", k_bytes=self.k_bytes)
        else:
            section["scheme"] = "dctcp"
        if self.rtt_s is not None:
            section["rtt_s"] = self.rtt_s
        try:
            return ecn_settings(section, self.rate_mbit, self.mtu_bytes,
                                self.resolved_buffer_bytes())
        except ConfigError as err:
            raise ConfigError(err.field.removeprefix("ecn."), err.problem) from None


def judged_window_s(config: DctcpConfig) -> tuple[float, float]:
    """The judged window, in seconds since the flows started: after TCP start-up, until
    just before the flows end (iperf3 runs ``omit_s`` + ``seconds``)."""
    return float(config.omit_s), config.omit_s + config.seconds - END_MARGIN_S


# --- the fabric -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bench:
    """The fabric of one sender count and the roles in it."""

    fabric: Fabric
    senders: tuple[str, ...]
    receiver: str
    bottleneck_intf: str  # the switch port toward the receiver
    bottleneck_label: str  # its direction, as testbed.measure.telemetry labels it


def bench_fabric(senders: int, rate_mbit: float, mtu_bytes: int) -> Bench:
    """One switch with ``senders`` + 1 hosts: the last host receives."""
    fabric = spine_leaf(leaves=1, spines=1, hosts_per_leaf=senders + 1, host_rate_mbit=rate_mbit,
                        mtu_bytes=mtu_bytes)
    hosts = [h.name for h in fabric.hosts]
    receiver = hosts[-1]
    switch, port = fabric.host_attachment(receiver)
    return Bench(fabric, tuple(hosts[:-1]), receiver, intf_name(switch, port),
                 f"{switch}->{receiver}")


def droptail_sysctls(tcp: TcpSettings) -> dict[str, str]:
    """The drop-tail hosts' sysctls: their congestion control, and ECN off outright (a new
    namespace's default, 2, would still accept it)."""
    return {**tcp.sysctls(), SYSCTL_TCP_ECN: TCP_ECN_OFF}


def tcp_label(tcp: dict) -> str:
    """``cubic``, ``cubic+ecn`` or ``dctcp`` (which brings its own ECN)."""
    cc = tcp.get("congestion_control") or "default"
    return f"{cc}+ecn" if tcp.get("ecn") and cc != "dctcp" else cc


# --- pure measurements ------------------------------------------------------------------------


PING_RTT = re.compile(r"=\s*([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)\s*ms")


def parse_ping_rtt_ms(text: str) -> dict | None:
    """min/avg/max RTT in ms from ``ping -q`` output; None when nothing was answered."""
    match = PING_RTT.search(text)
    if match is None:
        return None
    low, avg, high, _ = (float(x) for x in match.groups())
    return {"min_ms": low, "avg_ms": avg, "max_ms": high}


def window_samples(t_s: Sequence[float], depth_bytes: Sequence[int],
                   window_s: tuple[float, float]) -> tuple[list[float], list[int]]:
    """The samples taken inside ``window_s`` (both in seconds since the flows started)."""
    start, end = window_s
    kept = [(t, d) for t, d in zip(t_s, depth_bytes) if start <= t <= end]
    return [t for t, _ in kept], [d for _, d in kept]


def summarise_queue(t_s: Sequence[float], depth_bytes: Sequence[int],
                    window_s: tuple[float, float], mtu_bytes: int) -> dict:
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


# --- results ----------------------------------------------------------------------------------


@dataclass
class ConfigurationResult:
    """One sender count under one queueing: the bottleneck queue, utilisation, marks and
    drops, every flow's goodput, and whether the emulator kept up."""

    label: str
    senders: int
    queueing: str  # "droptail" or "ecn"
    rate_mbit: float
    mtu_bytes: int
    buffer_bytes: int
    k_bytes: int | None  # None: no marking
    tcp: dict  # testbed.plan.settings.TcpSettings.to_dict()
    ecn_path: str | None  # how the port was marked and sampled (eBPF or RED)
    bottleneck: str
    window_s: list[float]  # judged window, seconds since the flows started
    queue: dict  # summarise_queue
    utilisation: float  # bottleneck TX rate / link rate over the window
    bottleneck_mbit: float
    flow_mbit: list[float]
    jain: float
    marks: int | None
    fifo_drops: int
    virtual_fifo_drops: int | None  # the eBPF marker's model of the buffer (None: RED path)
    counters: dict  # the bottleneck's counters over the flows (testbed.measure.queues)
    fidelity: dict  # testbed.measure.fidelity.Verdict
    idle_rtt: dict | None  # ping before the flows: min/avg/max ms
    sampler_error: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class DctcpResult:
    config: dict
    k_scaling: dict | None  # testbed.plan.scaling's record (None: K as configured)
    paths: dict = field(default_factory=dict)  # testbed.capabilities.Paths
    runs: list[ConfigurationResult] = field(default_factory=list)


# --- verdict ----------------------------------------------------------------------------------


def pairs_by_senders(result: DctcpResult) -> dict[int, dict[str, ConfigurationResult]]:
    """{senders: {"droptail": run, "ecn": run}} in the order they ran."""
    grouped: dict[int, dict[str, ConfigurationResult]] = {}
    for run in result.runs:
        grouped.setdefault(run.senders, {})[run.queueing] = run
    return grouped


def sampled_enough(run: ConfigurationResult) -> bool:
    return run.sampler_error is None and run.queue["sampled_fraction"] >= MIN_SAMPLED_FRACTION


def judge_pair(droptail: ConfigurationResult, ecn: ConfigurationResult) -> dict:
    """The claim for one sender count: drop-tail's median queue near the buffer, ECN's
    within the tolerance of K at >= 90% utilisation, both measured by a sampler that kept
    up on an emulator that kept up."""
    tolerance = ECN_MEDIAN_TOLERANCE_FRAMES * ecn.mtu_bytes
    dt_median, ecn_median = droptail.queue["median_bytes"], ecn.queue["median_bytes"]
    dt_fraction = None if dt_median is None else dt_median / droptail.buffer_bytes
    rtt_ms = (ecn.idle_rtt or {}).get("avg_ms")
    floor = window_floor_bytes(ecn.senders, ecn.mtu_bytes, ecn.rate_mbit,
                               None if rtt_ms is None else rtt_ms / 1000)
    checks = {
        "droptail_median_near_buffer": dt_fraction is not None
        and dt_fraction >= DROPTAIL_MEDIAN_MIN_FRACTION,
        "ecn_median_near_k": ecn_median is not None and ecn.k_bytes is not None
        and abs(ecn_median - ecn.k_bytes) <= tolerance,
        "ecn_utilisation_ok": ecn.utilisation >= ECN_MIN_UTILISATION,
        "queue_sampled": sampled_enough(droptail) and sampled_enough(ecn),
        "emulator_kept_up": bool(droptail.fidelity.get("trustworthy"))
        and bool(ecn.fidelity.get("trustworthy")),
    }
    notes = []
    if ecn.k_bytes is not None and floor > ecn.k_bytes + tolerance:
        notes.append(f"{ecn.senders} flows at their smallest windows ({MIN_CWND_SEGMENTS} "
                     f"segments each) keep about {floor / ecn.mtu_bytes:.0f} packets queued, "
                     f"above K + tolerance ({(ecn.k_bytes + tolerance) / ecn.mtu_bytes:.0f}): "
                     f"no marking can hold this queue at K; a K above {floor:.0f} B can be")
    for run in (droptail, ecn):
        if not sampled_enough(run):
            notes.append(f"{run.label}: the queue sampler took "
                         f"{run.queue['sampled_fraction']:.0%} of the expected samples"
                         + (f" ({run.sampler_error})" if run.sampler_error else ""))
        if run.errors:
            notes.append(f"{run.label}: {len(run.errors)} flows failed: {run.errors[0]}")
        if not run.fidelity.get("trustworthy", False):
            notes.extend(f"{run.label}: {reason}" for reason in run.fidelity.get("reasons", []))
    return {
        **checks,
        "holds": all(checks.values()),
        "droptail_median_bytes": dt_median,
        "droptail_median_fraction_of_buffer": dt_fraction,
        "buffer_bytes": droptail.buffer_bytes,
        "ecn_median_bytes": ecn_median,
        "k_bytes": ecn.k_bytes,
        "ecn_median_minus_k_bytes": None if ecn_median is None or ecn.k_bytes is None
        else ecn_median - ecn.k_bytes,
        "ecn_utilisation": ecn.utilisation,
        "droptail_utilisation": droptail.utilisation,
        "window_floor_bytes": floor,
        "notes": notes,
    }


def verdict(result: DctcpResult) -> dict:
    """The claim judged for every sender count that ran both ways, with the tolerances."""
    by_senders = {str(n): judge_pair(runs[DROPTAIL], runs[ECN])
                  for n, runs in pairs_by_senders(result).items()
                  if DROPTAIL in runs and ECN in runs}
    return {
        "by_senders": by_senders,
        "emulator_kept_up": bool(by_senders) and all(v["emulator_kept_up"]
                                                     for v in by_senders.values()),
        "claim_holds": bool(by_senders) and all(v["holds"] for v in by_senders.values()),
        "tolerances": {"droptail_median_min_fraction_of_buffer": DROPTAIL_MEDIAN_MIN_FRACTION,
                       "ecn_median_tolerance_frames": ECN_MEDIAN_TOLERANCE_FRAMES,
                       "ecn_min_utilisation": ECN_MIN_UTILISATION,
                       "min_sampled_fraction": MIN_SAMPLED_FRACTION},
    }


# --- text -------------------------------------------------------------------------------------


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_run(run: ConfigurationResult) -> str:
    """One progress line for a finished configuration."""
    q = run.queue
    return (f"  queue median {_num(q['median_packets'], '.1f')} / p95 "
            f"{_num(q['p95_packets'], '.1f')} / max {_num(q['max_packets'], '.1f')} packets, "
            f"utilisation {run.utilisation:.1%}, marks {_num(run.marks, 'd')}, drops "
            f"{run.fifo_drops}, flows {sum(run.flow_mbit):.1f} Mbit/s (Jain {run.jain:.3f})"
            + (f"; {len(run.errors)} flows failed" if run.errors else ""))


def format_table(result: DctcpResult) -> str:
    """A row per configuration: the queue in packets, utilisation, marks, drops, goodput."""
    header = (f"{'senders':>7s}  {'queue':9s} {'tcp':10s} {'K':>5s} {'median':>7s} {'p95':>6s} "
              f"{'max':>6s} {'util':>6s} {'marks':>7s} {'drops':>6s} {'Mbit/s/flow':>11s} "
              f"{'Jain':>5s}  trusted")
    lines = ["", "queue in packets of the MTU; utilisation of the bottleneck port", header]
    for run in result.runs:
        q = run.queue
        k = None if run.k_bytes is None else run.k_bytes / run.mtu_bytes
        flows = (f"{min(run.flow_mbit):.1f}-{max(run.flow_mbit):.1f}" if run.flow_mbit else "-")
        lines.append(
            f"{run.senders:7d}  {'drop-tail' if run.queueing == DROPTAIL else 'ECN':9s} "
            f"{tcp_label(run.tcp):10s} {_num(k, '5.1f'):>5s} "
            f"{_num(q['median_packets'], '7.1f'):>7s} {_num(q['p95_packets'], '6.1f'):>6s} "
            f"{_num(q['max_packets'], '6.1f'):>6s} {run.utilisation:6.1%} "
            f"{_num(run.marks, '7d'):>7s} {run.fifo_drops:6d} {flows:>11s} {run.jain:5.3f}  "
            f"{'yes' if run.fidelity.get('trustworthy') else 'NO'}")
    return "\n".join(lines)


def format_reference(result: DctcpResult) -> str:
    """The published numbers (ANCHORS.md), each followed by ours."""
    mtu = result.config["mtu_bytes"]
    rate = result.config["rate_mbit"]
    grouped = [(n, runs[DROPTAIL], runs[ECN]) for n, runs in pairs_by_senders(result).items()
               if DROPTAIL in runs and ECN in runs]
    anchor, reproduction, claim = (entry["statement"] for entry in PUBLISHED)
    lines = ["", f"published, DCTCP: {anchor}"]
    ecn_runs = [r for r in result.runs if r.queueing == ECN]
    if ecn_runs and ecn_runs[0].k_bytes is not None:
        k_bytes = ecn_runs[0].k_bytes
        how = ("as configured" if result.k_scaling is None else
               f"scaled from the anchors, decided by {result.k_scaling['decided_by']}; the "
               f"anchor alone gives {result.k_scaling['scaled_value']:.0f} B")
        lines.append(f"  ours: K = {k_bytes} B = {k_bytes / mtu:.1f} packets at {rate:g} Mbit/s "
                     f"({how})")
    lines.append(f"published, Mininet-HiFi: {reproduction}")
    for n, dt, ecn in grouped:
        buffer_packets = dt.buffer_bytes / mtu
        dt_median, ecn_median = dt.queue["median_packets"], ecn.queue["median_packets"]
        share = "" if dt_median is None else f" ({dt_median / buffer_packets:.0%} of it)"
        lines.append(f"  ours: {n} senders, {rate:g} Mbit/s, {buffer_packets:.0f}-packet buffer: "
                     f"drop-tail median {_num(dt_median, '.1f')} packets{share}; ECN median "
                     f"{_num(ecn_median, '.1f')} packets at K = {ecn.k_bytes / mtu:.1f}")
    lines.append(f"published, claim: {claim}")
    for n, dt, ecn in grouped:
        lines.append(f"  ours: {n} senders: ECN utilisation {ecn.utilisation:.1%} with median "
                     f"{_num(ecn.queue['median_packets'], '.1f')} packets; drop-tail "
                     f"{dt.utilisation:.1%} with {_num(dt.queue['median_packets'], '.1f')}")
    return "\n".join(lines)


def format_verdict(v: dict) -> str:
    lines = [""]
    tol = v["tolerances"]
    for n, row in v["by_senders"].items():
        parts = [
            f"drop-tail median {_pct(row['droptail_median_fraction_of_buffer'])} of the buffer "
            f"(need {tol['droptail_median_min_fraction_of_buffer']:.0%})",
            f"ECN median - K = {_num(row['ecn_median_minus_k_bytes'], '.0f')} B (within "
            f"{tol['ecn_median_tolerance_frames']} frames: "
            f"{'yes' if row['ecn_median_near_k'] else 'NO'})",
            f"ECN utilisation {row['ecn_utilisation']:.1%} (need {tol['ecn_min_utilisation']:.0%})",
        ]
        lines.append(f"{n} senders: {'claim holds' if row['holds'] else 'claim NOT shown'}: "
                     + "; ".join(parts))
        lines.extend(f"  note: {note}" for note in row["notes"])
    lines.append("emulator kept up: " + ("yes" if v["emulator_kept_up"] else
                                         "NO: do not trust these numbers"))
    return "\n".join(lines)


def _pct(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def format_dctcp(result: DctcpResult) -> str:
    return "\n".join((format_table(result), format_reference(result),
                      format_verdict(verdict(result))))


# --- files and figures ------------------------------------------------------------------------


QUEUE_FILE = "queue.json"
SUMMARY_FILE = "summary.json"


def write_queue_samples(path: Path, t_s: Sequence[float], depth_bytes: Sequence[int],
                        read_s: Sequence[float]) -> None:
    """One configuration's samples: seconds since the flows started, bytes, read times."""
    path.write_text(json.dumps({"t_s": list(t_s), "depth_bytes": list(depth_bytes),
                                "read_s": list(read_s)}))


def write_dctcp_results(result: DctcpResult, workdir: Path) -> list[Path]:
    """summary.json (results, verdict, published numbers) and the figures."""
    summary = {"result": asdict(result), "verdict": verdict(result),
               "published": list(PUBLISHED)}
    (workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    return [workdir / SUMMARY_FILE, *plot_dctcp(workdir)]


def plot_dctcp(workdir: Path) -> list[Path]:
    """Queue length over time (drop-tail against ECN, K and the buffer drawn as lines) and
    the queue's CDF over the judged window, one panel per sender count, from the run's
    summary.json and each configuration's queue.json."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = json.loads((workdir / SUMMARY_FILE).read_text())["result"]["runs"]
    counts = list(dict.fromkeys(run["senders"] for run in runs))
    if not counts:
        return []
    styles = {DROPTAIL: ("tab:red", "drop-tail"), ECN: ("tab:blue", "ECN")}
    time_fig, time_axes = plt.subplots(len(counts), 1, figsize=(8, 3 * len(counts)),
                                       squeeze=False)
    cdf_fig, cdf_axes = plt.subplots(1, len(counts), figsize=(4.5 * len(counts), 3.5),
                                     squeeze=False)
    for col, n in enumerate(counts):
        t_ax, c_ax = time_axes[col][0], cdf_axes[0][col]
        for run in (r for r in runs if r["senders"] == n):
            samples = json.loads((workdir / run["label"] / QUEUE_FILE).read_text())
            mtu = run["mtu_bytes"]
            colour, name = styles[run["queueing"]]
            label = f"{name} ({tcp_label(run['tcp'])})"
            t_ax.plot(samples["t_s"], [d / mtu for d in samples["depth_bytes"]], lw=0.7,
                      color=colour, label=label)
            _, judged = window_samples(samples["t_s"], samples["depth_bytes"],
                                       tuple(run["window_s"]))
            ranked = sorted(d / mtu for d in judged)
            if ranked:
                c_ax.step(ranked, [(i + 1) / len(ranked) for i in range(len(ranked))],
                          where="post", color=colour, label=label)
            for ax, horizontal in ((t_ax, True), (c_ax, False)):
                line = ax.axhline if horizontal else ax.axvline
                if run["k_bytes"] is not None:
                    line(run["k_bytes"] / mtu, color="black", ls="--", lw=1,
                         label=f"K = {run['k_bytes'] / mtu:.1f}")
                if run["queueing"] == DROPTAIL:
                    line(run["buffer_bytes"] / mtu, color="grey", ls=":", lw=1,
                         label=f"buffer = {run['buffer_bytes'] / mtu:.0f}")
            t_ax.axvspan(0, run["window_s"][0], color="0.92", lw=0)
        rate = runs[0]["rate_mbit"]
        t_ax.set_title(f"{n} senders -> 1 receiver, {rate:g} Mbit/s bottleneck")
        t_ax.set_xlabel("seconds since the flows started (shaded: TCP start-up, not judged)")
        t_ax.set_ylabel("queue, packets")
        t_ax.legend(loc="upper right", fontsize=8)
        c_ax.set_title(f"{n} senders, judged window")
        c_ax.set_xlabel("queue, packets")
        c_ax.set_ylabel("fraction of samples")
        c_ax.set_ylim(0, 1.02)
        c_ax.legend(loc="lower right", fontsize=8)
    paths = []
    for fig, name in ((time_fig, "queue_time.png"), (cdf_fig, "queue_cdf.png")):
        fig.tight_layout()
        fig.savefig(workdir / name, dpi=120)
        plt.close(fig)
        paths.append(workdir / name)
    return paths


# --- running ----------------------------------------------------------------------------------


@contextmanager
def progress(log, series, intf: str, mtu_bytes: int, t_flows: float,
             every_s: float = PROGRESS_EVERY_S) -> Iterator[None]:
    """A line every ``every_s`` while the flows run: elapsed time and the latest queue."""
    stop = threading.Event()

    def tick():
        while not stop.wait(every_s):
            depths = series.depth_bytes.get(intf) or [0]
            log(f"  {time.monotonic() - t_flows:5.1f} s: queue {depths[-1] / mtu_bytes:.1f} "
                f"packets, {len(depths)} samples")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def idle_rtt(net, bench: Bench) -> dict | None:
    """The RTT from the first sender to the receiver before any flow runs."""
    out = net.host(bench.senders[0]).cmd(
        "ping", "-q", "-c", str(PING_COUNT), "-i", str(PING_INTERVAL_S),
        net.fabric.nodes[bench.receiver].ip)
    return parse_ping_rtt_ms(out)


def measure_configuration(net, bench: Bench, config: DctcpConfig, queueing: str,
                          tcp: TcpSettings, label: str, workdir: Path,
                          log) -> ConfigurationResult:
    """Every sender's long flow into the receiver at once, with the bottleneck queue sampled
    every 10 ms, link counters and CPU every 0.25 s, and the port's counters around it."""
    from testbed.harness.flows import SERVER_START_S, run_flows
    from testbed.measure.fidelity import emulator_losses, judge
    from testbed.measure.queues import counter_delta, queue_sampling
    from testbed.measure.stats import jain_index
    from testbed.measure.telemetry import (
        Sampler,
        link_directions,
        window_mean,
        window_rates_mbit,
    )

    sent, answered = net.ping_all()
    if answered != sent:
        raise TestbedError(f"{label}: only {answered}/{sent} probes answered; "
                           f"see {net.workdir}/controller.log")
    rtt = idle_rtt(net, bench)
    marking = net.marking
    pairs = [(sender, bench.receiver) for sender in bench.senders]
    before = marking.counters()
    switches_before = net.switch_counters()
    log(f"  {len(pairs)} flows for {config.omit_s} + {config.seconds} s; idle RTT "
        f"{_num(rtt and rtt['avg_ms'], '.2f')} ms")
    with Sampler(link_directions(net.fabric), net.switchd.pids) as sampler:
        t_queue0 = time.monotonic()
        with queue_sampling(marking.queue_depths, [bench.bottleneck_intf],
                            QUEUE_SAMPLE_MS / 1000) as series:
            t_call = time.monotonic()
            # run_flows starts the servers, waits SERVER_START_S, then starts every client
            t_flows = t_call + SERVER_START_S
            with progress(log, series, bench.bottleneck_intf, config.mtu_bytes, t_flows):
                rates, errors = run_flows(net, pairs, config.seconds, config.omit_s)
    counters = counter_delta(before, marking.counters())[bench.bottleneck_intf]
    switches = {k: v - switches_before[k] for k, v in net.switch_counters().items()}

    window = judged_window_s(config)
    t_rel = [t + t_queue0 - t_flows for t in series.t_s]
    depths = series.depth_bytes[bench.bottleneck_intf]
    write_queue_samples(workdir / QUEUE_FILE, t_rel, depths, series.read_s)
    start = sampler.since_start_s(t_flows + window[0])
    end = sampler.since_start_s(t_flows + window[1])
    bottleneck_mbit = window_rates_mbit(sampler.series, start, end)[bench.bottleneck_label]
    utilisation = bottleneck_mbit / config.rate_mbit
    lost = emulator_losses(switches["rx_packets"], switches["tx_packets"],
                           switches["queue_drops"])
    # Drop-tail TCP fills the port whatever happens: if the port is not busy, the emulator
    # held the traffic back. Under ECN a short port is what the run measures, not a fault.
    fidelity = judge(window_mean(sampler.series.cpu_busy_fraction, sampler.series, start, end),
                     window_mean(sampler.series.vswitchd_cores, sampler.series, start, end),
                     utilisation, lost / max(switches["rx_packets"], 1),
                     bandwidth_bound=queueing == DROPTAIL)
    queue_config = net.marking.queue
    return ConfigurationResult(
        label=label, senders=len(bench.senders), queueing=queueing, rate_mbit=config.rate_mbit,
        mtu_bytes=config.mtu_bytes, buffer_bytes=queue_config.buffer_bytes,
        k_bytes=None if queue_config.ecn is None else queue_config.ecn.start_bytes,
        tcp=tcp.to_dict(), ecn_path=marking.path, bottleneck=bench.bottleneck_intf,
        window_s=list(window), queue=summarise_queue(t_rel, depths, window, config.mtu_bytes),
        utilisation=utilisation, bottleneck_mbit=bottleneck_mbit, flow_mbit=rates,
        jain=jain_index(rates), marks=counters.get("marks"),
        fifo_drops=counters.get("fifo_drops") or 0,
        virtual_fifo_drops=counters.get("virtual_fifo_drops"), counters=counters,
        fidelity={**fidelity.to_dict(), "switch_packets": switches, "emulator_lost": lost},
        idle_rtt=rtt, sampler_error=series.error, errors=errors)


def run_dctcp(config: DctcpConfig, log=print) -> DctcpResult:
    """Every sender count, drop-tail then ECN, each on a fabric of its own; writes the
    results and figures into a new run folder and returns the results."""
    from testbed.apply.network import FabricNetwork
    from testbed.capabilities import detect
    from testbed.harness.run import interrupts_as_exceptions, machine, new_run_id
    from testbed.plan.settings import tcp_settings

    config.validate()
    ecn = config.ecn_settings()
    platform = detect()
    tcp = {DROPTAIL: tcp_settings(False, config.droptail_cc, platform),
           ECN: tcp_settings(True, config.ecn_cc, platform)}
    queues = {DROPTAIL: QueueConfig(ecn.queue.buffer_bytes), ECN: ecn.queue}
    sysctls = {DROPTAIL: droptail_sysctls(tcp[DROPTAIL]), ECN: tcp[ECN].sysctls()}
    datapath = "kernel" if platform.paths.ovs_datapath == "kernel" else "user"
    result = DctcpResult(config=asdict(config),
                         k_scaling=(ecn.scaling or {}).get("ecn", [None])[0],
                         paths=asdict(platform.paths))
    run_id = new_run_id("dctcp")
    workdir = Path(config.results_dir) / run_id
    total = len(config.senders) * len(QUEUEINGS)
    log(f"run {run_id}: {', '.join(map(str, config.senders))} senders -> 1 receiver at "
        f"{config.rate_mbit:g} Mbit/s, buffer {ecn.queue.buffer_bytes} B, K "
        f"{ecn.queue.ecn.start_bytes} B; ECN hosts {tcp_label(tcp[ECN].to_dict())} "
        f"({tcp[ECN].decided_by})")
    with interrupts_as_exceptions(), machine(run_id, log) as ledger:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(json.dumps(asdict(config), indent=1))
        for n in config.senders:
            bench = bench_fabric(n, config.rate_mbit, config.mtu_bytes)
            for queueing in QUEUEINGS:
                label = f"n{n}-{queueing}"
                log(f"{len(result.runs) + 1}/{total} {label}: {n} senders, "
                    f"{'drop-tail' if queueing == DROPTAIL else 'ECN at K'}, hosts "
                    f"{tcp_label(tcp[queueing].to_dict())}; bringing up the switch")
                (workdir / label).mkdir()
                with FabricNetwork(bench.fabric, workdir / label, ledger, datapath=datapath,
                                   routing="ecmp", log=log, queue=queues[queueing],
                                   host_sysctls=sysctls[queueing]) as net:
                    run = measure_configuration(net, bench, config, queueing, tcp[queueing],
                                                label, workdir / label, log)
                result.runs.append(run)
                log(format_run(run))
    write_dctcp_results(result, workdir)
    log(format_dctcp(result))
    log(f"results in {workdir}")
    return result


def replot(workdir: str | Path) -> list[Path]:
    """Redraw a finished run's figures from its files."""
    path = Path(workdir)
    if not (path / SUMMARY_FILE).exists():
        raise TestbedError(f"{path} has no {SUMMARY_FILE}: not a finished dctcp run")
    return plot_dctcp(path)
