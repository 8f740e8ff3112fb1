"""One incast measurement's figures, pure: completion-time statistics, goodput against the
ideal, losses, marks and pauses (testbed.experiments.incast.workload.IncastMeasurement in,
plain data out)."""
from __future__ import annotations

from testbed.experiments.incast.workload import IncastMeasurement
from testbed.measure.fidelity import emulator_losses
from testbed.measure.stats import percentile


def completion_stats(values: list[float]) -> dict:
    """Count, mean, median, p99 and max of completion times in seconds (None when empty)."""
    if not values:
        return {"count": 0, "mean_s": None, "median_s": None, "p99_s": None, "max_s": None}
    return {"count": len(values), "mean_s": sum(values) / len(values),
            "median_s": percentile(values, 50), "p99_s": percentile(values, 99),
            "max_s": max(values)}


def ideal_round_s(fanin: int, response_bytes: int, rate_mbit: float) -> float:
    """The time the receiver's link needs for a round's payload at its full rate: a lower
    bound (headers and the request's round trip not counted)."""
    return fanin * response_bytes * 8 / (rate_mbit * 1e6)


def summarize(m: IncastMeasurement, rate_mbit: float) -> dict:
    """One measurement's figures: completion statistics, goodput, losses, marks, pauses."""
    rounds = completion_stats(m.round_s)
    flows = completion_stats([t for r in m.flow_s for t in r])
    ideal = ideal_round_s(m.fanin, m.response_bytes, rate_mbit)
    goodput = [m.fanin * m.response_bytes * 8 / s / 1e6 for s in m.round_s if s > 0]
    median_goodput = percentile(goodput, 50) if goodput else None
    sender_tcp = [m.tcp[s] for s in m.senders if s in m.tcp]
    switch_drops = m.switches.get("queue_drops", 0)
    lost = emulator_losses(m.switches.get("rx_packets", 0), m.switches.get("tx_packets", 0),
                           switch_drops)
    totals = (m.queues or {}).get("totals") or {}
    pfc = m.pfc or {}
    return {
        "mode": m.mode, "fanin": m.fanin, "rounds_done": len(m.round_s), "error": m.error,
        "round": rounds, "flow": flows, "ideal_round_s": ideal,
        "median_over_ideal": rounds["median_s"] / ideal if rounds["median_s"] else None,
        "goodput_mbit": median_goodput,
        "goodput_fraction": median_goodput / rate_mbit if median_goodput is not None else None,
        "send_spread_max_s": max(m.send_spread_s, default=None),
        "warmup_round_s": m.warmup_round_s,
        "tcp_timeouts": sum(c["timeouts"] for c in m.tcp.values()),
        "tcp_probe_recoveries": sum(c.get("probe_recoveries", 0) for c in m.tcp.values()),
        "tcp_timer_recoveries": sum(c["timeouts"] + c.get("probe_recoveries", 0)
                                    for c in m.tcp.values()),
        "tcp_retransmits": sum(c["retransmits"] for c in m.tcp.values()),
        "sender_timeouts": sum(c["timeouts"] for c in sender_tcp),
        "queue_drops": m.queue_drops, "switch_queue_drops": switch_drops,
        "host_queue_drops": m.queue_drops - switch_drops,
        "ce_marks": totals.get("marks"), "max_queue_bytes": totals.get("max_queue_bytes"),
        "pause_frames_sent": pfc.get("pause_frames_sent"),
        "paused_time_s": pfc.get("paused_time_s"),
        "lossless_drops": pfc.get("lossless_drops"),
        "emulator_lost_packets": lost,
        "emulator_loss_fraction": lost / max(m.switches.get("rx_packets", 0), 1),
    }


def timeout_onset(rows: list[dict]) -> int | None:
    """The smallest fan-in among ``rows`` (one mode's summaries) where TCP waited on a
    retransmission timer (an RTO, or a tail-loss probe that repaired a loss)."""
    return min((s["fanin"] for s in rows if s["tcp_timer_recoveries"] > 0), default=None)


def measurement_line(s: dict) -> str:
    """One progress line for a measurement's summary."""
    r = s["round"]
    times = (f"median {r['median_s']:.3f} s, p99 {r['p99_s']:.3f} s, max {r['max_s']:.3f} s"
             if r["count"] else "no round completed")
    extra = ""
    if s["ce_marks"] is not None:
        extra += f", {s['ce_marks']} CE marks"
    if s["pause_frames_sent"] is not None:
        extra += f", {s['pause_frames_sent']} pauses sent, {s['lossless_drops']} lossless drops"
    line = (f"fan-in {s['fanin']:2d}: {s['rounds_done']} rounds, {times} (ideal "
            f"{s['ideal_round_s']:.3f} s); {s['queue_drops']} queue drops, "
            f"{s['tcp_timeouts']} TCP timeouts, {s['tcp_probe_recoveries']} tail-loss probe "
            f"recoveries, {s['tcp_retransmits']} retransmits{extra}")
    return line + (f"; STOPPED: {s['error']}" if s["error"] else "")
