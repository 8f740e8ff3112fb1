"""What incast's modes claim, judged from their measurements at the largest fan-in (pure:
each setup's results in, testbed.model.verdict checks out).

- drop-tail: the incast overflows the receiver's queue, and the losses that hit a flow's
  last packets are repaired only when a retransmission timer fires (Vasudevan et al.,
  SIGCOMM 2009): the RTO, or in Linux the tail-loss probe (RFC 8985) that fires before it
  and resends the last segment, so timer recoveries count both;
- ECN: the queue marks, and (where drop-tail waited on timers) fewer timer recoveries follow
  (Alizadeh et al., SIGCOMM 2010);
- PFC: the lossless class loses nothing and the fabric pauses instead (IEEE 802.1Qbb);
- ECN and PFC: query completion's tail at least ``FASTER_BY`` below drop-tail's;
- every recorded query completed, in every mode;
- with a capture of the pause frames: tshark decodes every captured frame as PFC, and there
  are as many as the pause agent says it sent on that link.
"""
from __future__ import annotations

from testbed.measure.pauses import capture_checks
from testbed.model.verdict import Check, at_least, at_most

DROPTAIL, ECN, PFC = "droptail", "ecn", "pfc"
MODES = (DROPTAIL, ECN, PFC)
# Named tolerances.
FASTER_BY = 0.10  # a mode's p99 completion "below drop-tail's": at least 10% lower


def largest_fanin(results: dict[str, dict]) -> tuple[int | None, dict[str, dict]]:
    """The largest fan-in measured, and each mode's summary at it."""
    fanins = [s["fanin"] for r in results.values() for s in r["summaries"]]
    if not fanins:
        return None, {}
    fanin = max(fanins)
    return fanin, {mode: s for mode, r in results.items() for s in r["summaries"]
                   if s["fanin"] == fanin}


def completion_checks(results: dict[str, dict], rounds: int) -> list[Check]:
    """Every recorded query completed, per mode (a round that timed out stops the client)."""
    checks = []
    for mode, r in results.items():
        done = sum(s["rounds_done"] for s in r["summaries"])
        expected = rounds * len(r["summaries"])
        stopped = [f"fan-in {s['fanin']} stopped after {s['rounds_done']} rounds: {s['error']}"
                   for s in r["summaries"] if s["error"]]
        checks.append(at_least("every query completed", done, expected, "queries",
                               f"{mode}: {done} of {expected} recorded queries completed"
                               + (f" ({'; '.join(stopped)})" if stopped else ""), mode))
    return checks


def timers(s: dict) -> str:
    """A mode's timer recoveries, in words."""
    return (f"{s['tcp_timer_recoveries']} timer recoveries ({s['tcp_timeouts']} RTOs, "
            f"{s['tcp_probe_recoveries']} tail-loss probes that repaired a loss)")


def droptail_checks(fanin: int, drop: dict) -> list[Check]:
    agrees = "as" if drop["tcp_timer_recoveries"] > 0 else "NOT as"
    return [
        at_least("drop-tail drops packets", drop["queue_drops"], 1, "packets",
                 f"drop-tail, fan-in {fanin}: {drop['queue_drops']} queue drops "
                 f"({drop['switch_queue_drops']} at switch ports)", DROPTAIL),
        at_least("drop-tail waits on retransmission timers", drop["tcp_timer_recoveries"], 1,
                 "recoveries", f"drop-tail, fan-in {fanin}: {timers(drop)} ({agrees} incast "
                 "predicts: tail losses repaired only when a retransmission timer fires)",
                 DROPTAIL),
    ]


def ecn_checks(fanin: int, ecn: dict, drop: dict | None) -> list[Check]:
    checks = [at_least("ECN marks", ecn["ce_marks"], 1, "CE marks",
                       f"ECN, fan-in {fanin}: {ecn['ce_marks']} CE marks, {ecn['queue_drops']} "
                       f"queue drops, {timers(ecn)}", ECN)]
    if drop is None:
        return checks
    ours, theirs = ecn["tcp_timer_recoveries"], drop["tcp_timer_recoveries"]
    name = "ECN: fewer timer recoveries than drop-tail"
    if theirs == 0:
        checks.append(Check(name, ours, "< 0", None, "recoveries", None,
                            "drop-tail had no timer recoveries for ECN to remove", ECN))
    else:
        fewer = ours < theirs
        checks.append(Check(name, ours, f"< {theirs}", None, "recoveries", fewer,
                            f"ECN, fan-in {fanin}: {timers(ecn)}, "
                            f"{'fewer' if fewer else 'NOT fewer'} than drop-tail's {theirs}", ECN))
    return checks


def pfc_checks(fanin: int, pfc: dict) -> list[Check]:
    held = ("lossless as 802.1Qbb promises" if pfc["lossless_drops"] == 0
            and pfc["switch_queue_drops"] == 0 else "NOT lossless")
    where = (f"PFC, fan-in {fanin}: {pfc['lossless_drops']} drops in the lossless class, "
             f"{pfc['switch_queue_drops']} at switch queues, {pfc['host_queue_drops']} at host "
             f"NICs ({held})")
    return [
        at_most("PFC: lossless-class drops", pfc["lossless_drops"], 0, "packets", where, PFC),
        at_most("PFC: switch queue drops", pfc["switch_queue_drops"], 0, "packets", where, PFC),
        at_least("PFC pauses instead", pfc["pause_frames_sent"], 1, "frames",
                 f"PFC, fan-in {fanin}: {pfc['pause_frames_sent']} pause frames sent, "
                 f"{pfc['paused_time_s']} port-s paused", PFC),
    ]


def tail_check(fanin: int, mode: str, row: dict, drop: dict) -> Check:
    """``mode``'s p99 query completion at least FASTER_BY below drop-tail's."""
    name = f"{mode} p99 query completion below drop-tail's"
    ours, theirs = row["round"]["p99_s"], drop["round"]["p99_s"]
    if theirs is None:
        return Check(name, ours, None, FASTER_BY, "s", None,
                     f"drop-tail completed no query at fan-in {fanin}", mode)
    bound = round(theirs * (1 - FASTER_BY), 6)
    below = ours is not None and ours <= bound
    text = "no query completed" if ours is None else f"{ours:.3f} s"
    return at_most(name, ours, bound, "s",
                   f"p99 query completion at fan-in {fanin}: {mode} {text} vs drop-tail "
                   f"{theirs:.3f} s ({'' if below else 'NOT '}at least {FASTER_BY:.0%} lower)",
                   mode)


def incast_checks(results: dict[str, dict], rounds: int) -> list[Check]:
    """Every claim of the modes that ran; comparisons only where drop-tail ran too."""
    fanin, top = largest_fanin(results)
    checks = completion_checks(results, rounds)
    if fanin is None:
        return checks
    drop, ecn, pfc = top.get(DROPTAIL), top.get(ECN), top.get(PFC)
    if drop is not None:
        checks += droptail_checks(fanin, drop)
    if ecn is not None:
        checks += ecn_checks(fanin, ecn, drop)
    if pfc is not None:
        checks += pfc_checks(fanin, pfc)
    for mode, row in ((ECN, ecn), (PFC, pfc)):
        if row is not None and drop is not None:
            checks.append(tail_check(fanin, mode, row, drop))
    capture = results.get(PFC, {}).get("pause_capture")
    if capture is not None:
        checks += capture_checks(capture, PFC)
    return checks
