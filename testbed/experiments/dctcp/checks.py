"""The DCTCP micro-benchmark's claims, judged from every setup's results, and its printed
summary with the published numbers beside ours.

For every sender count (testbed.experiments.dctcp.experiment runs each one drop-tail and
ECN, a setup each), judged on the bottleneck's real queue (its buffer qdisc's backlog,
testbed.measure.backlog) over the judged window:

- drop-tail: the queue's 95th percentile is at least ``DROPTAIL_P95_MIN_FRACTION`` of the
  buffer (loss-based TCP pushes it up to the buffer between losses);
- ECN: the median queue is within ``ECN_MEDIAN_TOLERANCE_FRAMES`` frames of K, and the
  bottleneck carries at least ``ECN_MIN_UTILISATION`` of its rate;
- both: the sampler delivered at least ``MIN_SAMPLED_FRACTION`` of the samples the window
  holds at 10 ms, or its statistics describe too few instants.

When N flows at Linux's smallest window (2 segments each) already queue more than K plus
the tolerance, no marking can hold that queue at K: the ECN check then asks the median queue
to be at most that floor plus the tolerance instead (the lowest queue any window-based TCP can
keep; ECN's claim is that marking holds the queue down there, while drop-tail fills the
buffer), and says so.
"""
from __future__ import annotations

from dataclasses import replace

from testbed.experiments.dctcp.bench import (
    DROPTAIL,
    ECN,
    MIN_CWND_SEGMENTS,
    QUEUEING_NAMES,
    tcp_label,
    window_floor_bytes,
)
from testbed.model.rows import Number, Row
from testbed.model.verdict import Check, at_least, at_most, near

# Named tolerances.
# Drop-tail: loss-based TCP grows its window until the buffer overflows, so the sawtooth's
# crests (the queue's p95) reach toward the buffer whatever the congestion control; its
# troughs do not: cubic backs off to 0.7 of its window, reno to 0.5, synchronised losses and
# timeouts lower, so the median is not the claim (reno's median in a stock-kernel guest under
# software emulation read 0.42-0.65 of the buffer over eight runs, on the line of a 0.5
# check). Half the buffer for the crest still sets drop-tail apart from ECN, whose queue
# stays at K, a few percent of the buffer.
DROPTAIL_P95_MIN_FRACTION = 0.5
# ECN: senders react one RTT after a mark, so the queue rides a few frames above K.
ECN_MEDIAN_TOLERANCE_FRAMES = 3
ECN_MIN_UTILISATION = 0.90  # the DCTCP claim: full throughput with the short queue
# The sampler must deliver at least this fraction of the samples the window holds at
# 10 ms, or its statistics describe too few instants.
MIN_SAMPLED_FRACTION = 0.5

DCTCP_ANCHOR, MININET_HIFI, DCTCP_CLAIM = PUBLISHED = (
    {"source": "DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257)",
     "statement": "mark CE above K; K = 20 packets at 1 Gbit/s, 65 at 10 Gbit/s; K > C*RTT/7"},
    {"source": "Mininet-HiFi reproduction (Handigol et al., CoNEXT 2012)",
     "statement": "2 senders -> 1 receiver, 100 Mbit/s, 425-packet queue: DCTCP holds the "
                  "queue near K while TCP fills the buffer"},
    {"source": "DCTCP claim",
     "statement": "ECN marking keeps the median queue near K while utilisation stays >= 90%"},
)


def published(entry: dict) -> str:
    return f"published, {entry['source']}: {entry['statement']}"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def ecn_tolerance_bytes(r: dict) -> int:
    return ECN_MEDIAN_TOLERANCE_FRAMES * r["mtu_bytes"]


def floor_bytes(r: dict) -> float:
    """The queue an ECN setup's flows keep at their smallest windows (testbed.experiments.
    dctcp.bench.window_floor_bytes), at the RTT measured before the flows."""
    rtt_ms = (r.get("idle_rtt") or {}).get("avg_ms")
    return window_floor_bytes(r["senders"], r["mtu_bytes"], r["rate_mbit"],
                              None if rtt_ms is None else rtt_ms / 1000)


def window_floor_note(r: dict) -> str | None:
    """Why marking cannot hold an ECN setup's queue at K, when it cannot."""
    floor = floor_bytes(r)
    limit = r["k_bytes"] + ecn_tolerance_bytes(r)
    if floor <= limit:
        return None
    mtu = r["mtu_bytes"]
    return (f"{r['senders']} flows at their smallest windows ({MIN_CWND_SEGMENTS} segments "
            f"each) keep about {floor / mtu:.0f} packets queued, above K + tolerance "
            f"({limit / mtu:.0f}): no marking can hold this queue at K; a K above "
            f"{floor:.0f} B can be")


def sampled_enough(r: dict) -> bool:
    return r["sampler_error"] is None and r["queue"]["sampled_fraction"] >= MIN_SAMPLED_FRACTION


def setup_notes(name: str, r: dict) -> list[str]:
    """What else a reader of one setup's checks should know: a sampler that stopped, flows
    that failed."""
    notes = []
    if r["sampler_error"]:
        notes.append(f"the queue sampler stopped: {r['sampler_error']}")
    if r["errors"]:
        notes.append(f"{len(r['errors'])} flows failed: {r['errors'][0]}")
    return notes


def _statement(text: str, notes: list[str]) -> str:
    return "; ".join([text, *(f"note: {n}" for n in notes)])


def describe(r: dict) -> str:
    """``2 senders, ECN (cubic+ecn)``."""
    return f"{r['senders']} senders, {QUEUEING_NAMES[r['queueing']]} ({tcp_label(r['tcp'])})"


def droptail_checks(name: str, r: dict) -> list[Check]:
    p95, median = r["queue"]["p95_bytes"], r["queue"]["median_bytes"]
    fraction = None if p95 is None else round(p95 / r["buffer_bytes"], 4)
    mtu = r["mtu_bytes"]
    text = (f"{describe(r)}: queue p95 {_num(p95 and p95 / mtu, '.1f')} of "
            f"{r['buffer_bytes'] / mtu:.0f} packets ({_num(fraction, '.0%')} of the buffer), "
            f"median {_num(median and median / mtu, '.1f')} (real backlog of "
            f"{r['bottleneck']}); {published(MININET_HIFI)}")
    return [at_least("drop-tail queue p95", fraction, DROPTAIL_P95_MIN_FRACTION,
                     "fraction of the buffer", _statement(text, setup_notes(name, r)), name)]


def ecn_checks(name: str, r: dict) -> list[Check]:
    median, k = r["queue"]["median_bytes"], r["k_bytes"]
    mtu = r["mtu_bytes"]
    notes = setup_notes(name, r)
    floor_note = window_floor_note(r)
    target, target_name, check_name = k, f"K = {k / mtu:.1f}", "ECN median queue near K"
    if floor_note:
        notes.append(floor_note + "; judged against that floor instead")
        target = round(floor_bytes(r))
        target_name = f"the window floor of {target / mtu:.1f} (K = {k / mtu:.1f})"
        check_name = "ECN median queue at most the window floor"
    near_k = (f"{describe(r)}: median queue {_num(median and median / mtu, '.1f')} packets "
              f"(real backlog of {r['bottleneck']}) against {target_name}, within "
              f"{ECN_MEDIAN_TOLERANCE_FRAMES} frames{' above' if floor_note else ''}; "
              f"{published(DCTCP_ANCHOR)}")
    utilisation = (f"{describe(r)}: the bottleneck carried {r['utilisation']:.1%} of "
                   f"{r['rate_mbit']:g} Mbit/s with the median queue at "
                   f"{_num(median and median / mtu, '.1f')} packets; {published(DCTCP_CLAIM)}")
    measured = None if median is None else round(median, 1)
    if floor_note:  # below the floor is lower still: only a queue above it fails
        queue_check = at_most(check_name, measured, target + ecn_tolerance_bytes(r), "bytes",
                              _statement(near_k, notes), name)
    else:
        queue_check = near(check_name, measured, target, ecn_tolerance_bytes(r), "bytes",
                           _statement(near_k, notes), name)
    return [
        queue_check,
        at_least("ECN utilisation", round(r["utilisation"], 4), ECN_MIN_UTILISATION,
                 "fraction of the link rate", _statement(utilisation, []), name),
    ]


def sampling_check(name: str, r: dict) -> Check:
    q = r["queue"]
    check = at_least("queue sampled", round(q["sampled_fraction"], 4), MIN_SAMPLED_FRACTION,
                     "fraction of expected samples",
                     _statement(f"{describe(r)}: {q['samples']} samples of the real backlog in "
                                f"the judged window, every {_num(q['interval_ms_mean'], '.1f')} "
                                f"ms on average (10 ms asked)", setup_notes(name, r)), name)
    return check if r["sampler_error"] is None else replace(check, passed=False)


def dctcp_checks(results: dict[str, dict]) -> list[Check]:
    """Every setup's claims, in the order the setups ran."""
    checks: list[Check] = []
    for name, r in results.items():
        if "queue" not in r:  # a setup that failed before it measured
            continue
        checks += droptail_checks(name, r) if r["queueing"] == DROPTAIL else ecn_checks(name, r)
        checks.append(sampling_check(name, r))
    return checks


# --- the printed summary ----------------------------------------------------------------------


def pairs_by_senders(results: dict[str, dict]) -> dict[int, dict[str, dict]]:
    """{senders: {"droptail": results, "ecn": results}} in the order they ran."""
    grouped: dict[int, dict[str, dict]] = {}
    for r in results.values():
        if "queue" in r:
            grouped.setdefault(r["senders"], {})[r["queueing"]] = r
    return grouped


def setup_row(name: str, r: dict) -> Row:
    """One setup: its real queue, the marker's model of it, utilisation, marks, drops,
    flows and whether the emulator kept up."""
    mtu = r["mtu_bytes"]
    q = r["queue"]
    parts = [f"queue median/p95/max {_num(q['median_packets'], '.1f')}/"
             f"{_num(q['p95_packets'], '.1f')}/{_num(q['max_packets'], '.1f')} packets "
             f"(qdisc backlog)"]
    model, divergence = r.get("marker_queue"), r.get("divergence")
    if model is not None and divergence is not None:
        parts.append(f"marker's model median {_num(model['median_packets'], '.1f')}, "
                     f"mean |model - qdisc| {divergence['mean_abs_bytes'] / mtu:.1f} packets")
    flows = r["flow_mbit"]
    parts += [f"utilisation {r['utilisation']:.1%}", f"marks {_num(r['marks'], 'd')}",
              f"drops {r['fifo_drops']}",
              f"flows {min(flows):.1f}-{max(flows):.1f} Mbit/s (Jain {r['jain']:.3f})"
              if flows else "no flows",
              f"emulator kept up: {'yes' if r['fidelity'].get('trustworthy') else 'NO'}"]
    return Row(f"{name}: {describe(r)}", "; ".join(parts),
               Number("queue median", q["median_packets"], "packets"),
               Number("queue p95", q["p95_packets"], "packets"),
               Number("queue max", q["max_packets"], "packets"),
               Number("utilisation", r["utilisation"], "fraction"),
               Number("marks", r["marks"], ""), Number("drops", r["fifo_drops"], ""),
               Number("Jain index", r["jain"] if flows else None, ""))


def k_row(r: dict) -> tuple[str, str]:
    """K as the run chose it, from an ECN setup's results."""
    k, mtu = r["k_bytes"], r["mtu_bytes"]
    scaling = r.get("k_scaling")
    how = ("as configured" if scaling is None else
           f"scaled from the anchors, decided by {scaling['decided_by']}; the anchor alone "
           f"gives {scaling['scaled_value']:.0f} B")
    return "ours: K", f"K = {k} B = {k / mtu:.1f} packets at {r['rate_mbit']:g} Mbit/s ({how})"


def pair_rows(n: int, pair: dict[str, dict]) -> tuple[Row, Row]:
    """For one sender count, ours beside the Mininet-HiFi reproduction (the two queues) and
    beside the DCTCP claim (utilisation with the queue)."""
    dt, ecn = pair[DROPTAIL], pair[ECN]
    mtu = dt["mtu_bytes"]
    buffer_packets = dt["buffer_bytes"] / mtu
    dt_median, ecn_median = dt["queue"]["median_packets"], ecn["queue"]["median_packets"]
    share = "" if dt_median is None else f" ({dt_median / buffer_packets:.0%} of it)"
    medians = (Number("drop-tail median", dt_median, "packets"),
               Number("ECN median", ecn_median, "packets"))
    return (Row(f"ours: {n} senders, queues",
                f"{dt['rate_mbit']:g} Mbit/s, {buffer_packets:.0f}-packet buffer: drop-tail "
                f"median {_num(dt_median, '.1f')} packets{share}; ECN median "
                f"{_num(ecn_median, '.1f')} packets at K = {ecn['k_bytes'] / mtu:.1f}",
                *medians),
            Row(f"ours: {n} senders, utilisation",
                f"ECN {ecn['utilisation']:.1%} with median {_num(ecn_median, '.1f')} packets; "
                f"drop-tail {dt['utilisation']:.1%} with {_num(dt_median, '.1f')}",
                Number("ECN utilisation", ecn["utilisation"], "fraction"),
                Number("drop-tail utilisation", dt["utilisation"], "fraction")))


def summary_rows(results: dict[str, dict]) -> list[tuple[str, str]]:
    """A row per setup, then each published statement with ours beside it."""
    rows = [setup_row(name, r) for name, r in results.items() if "queue" in r]
    paired = [pair_rows(n, pair) for n, pair in pairs_by_senders(results).items()
              if DROPTAIL in pair and ECN in pair]
    ecn_runs = [r for r in results.values() if "queue" in r and r["queueing"] == ECN]
    rows.append((f"published: {DCTCP_ANCHOR['source']}", DCTCP_ANCHOR["statement"]))
    if ecn_runs:
        rows.append(k_row(ecn_runs[0]))
    rows.append((f"published: {MININET_HIFI['source']}", MININET_HIFI["statement"]))
    rows += [queues for queues, _ in paired]
    rows.append((f"published: {DCTCP_CLAIM['source']}", DCTCP_CLAIM["statement"]))
    rows += [utilisation for _, utilisation in paired]
    return rows
