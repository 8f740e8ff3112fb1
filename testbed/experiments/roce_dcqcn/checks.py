"""roce-dcqcn's claims, judged from every setup's results, and its printed summary.

Per DCQCN setup, over the judged window:

- fairness: the Jain index of the senders' rates over the window (each sender's link
  counters; its goodput over the whole run if they are missing) is at least ``MIN_JAIN``
  (the issue's claim: the flows converge to a fair share);
- the queue: the mean of the real queue (the bottleneck's lossless-class backlog, sampled
  every 10 ms) lies between Kmin and Kmax, within ``QUEUE_TOLERANCE_FRAMES`` full RoCE
  frames either side. The mean, as DCQCN's fluid model (Zhu et al., section 5) puts its
  fixed point on the average queue: the rate cuts come one CNP interval after the marks,
  so the queue swings, and its median may sit below Kmin between bursts; median, p95 and
  max are reported beside it, not judged;
- the link stays busy: the bottleneck carried at least ``MIN_UTILISATION`` of its rate
  (a DCQCN that cut too far shows here);
- the queue is sampled: at least ``MIN_SAMPLED_FRACTION`` of the samples the window holds.

Without congestion control (the ``none`` setup): the median real queue is at least Kmax
(line-rate senders fill the queue past the marking range, up to PFC's XOFF).

Every setup: data verified on every flow; the packet sample decodes as InfiniBand BTH and
its ICRC verifies.
"""
from __future__ import annotations

from testbed.measure.roce import capture_checks, verified_check
from testbed.model.rows import Number, Row
from testbed.model.verdict import Check, at_least, holds

# Named tolerances.
MIN_JAIN = 0.95
# DCQCN trades some of the link for its short queue: after a cut the rate climbs back by
# timers (scaled with the link), and the queue sits empty meanwhile (median 0 B at 20 Mbit/s
# with two QPs, where the link carried 89%); a DCQCN that cut too far falls well below.
MIN_UTILISATION = 0.85
QUEUE_TOLERANCE_FRAMES = 2
MIN_SAMPLED_FRACTION = 0.5


def _kb(value) -> str:
    return "-" if value is None else f"{value / 1000:.1f} KB"


def queue_between(name: str, r: dict) -> Check:
    """The mean real queue between Kmin and Kmax, within the tolerance."""
    q = r["queue"]
    mean, low, high = q["mean_bytes"], r["kmin_bytes"], r["kmax_bytes"]
    slack = QUEUE_TOLERANCE_FRAMES * r["frame_bytes"]
    inside = None if mean is None else low - slack <= mean <= high + slack
    return holds("mean queue between Kmin and Kmax", inside,
                 f"{r['senders']} DCQCN QPs: mean real queue {_kb(mean)} (median "
                 f"{_kb(q['median_bytes'])}, p95 {_kb(q['p95_bytes'])}, max "
                 f"{_kb(q['max_bytes'])}, {q['samples']} samples of {r['bottleneck']}'s "
                 f"lossless class) against Kmin {_kb(low)} and Kmax {_kb(high)}, "
                 f"{QUEUE_TOLERANCE_FRAMES} frames of slack", name,
                 measured=None if mean is None else round(mean, 1),
                 expected=f"[{low - slack}, {high + slack}]")


def setup_checks(name: str, r: dict) -> list[Check]:
    checks = [verified_check(r["flows"], name)]
    if r["cc"] == "dcqcn":
        rates = ", ".join(f"{x:.2f}" for x in (r.get("sender_mbit") or r["goodput_mbit"]))
        checks += [
            at_least("DCQCN flows share fairly", None if r["jain"] is None
                     else round(r["jain"], 4), MIN_JAIN, "Jain index",
                     f"{r['senders']} DCQCN QPs at {rates} Mbit/s over the judged window",
                     name),
            queue_between(name, r),
            at_least("utilisation with DCQCN", None if r["utilisation"] is None
                     else round(r["utilisation"], 4), MIN_UTILISATION, "fraction of the link",
                     f"the bottleneck {r['bottleneck_label']} carried "
                     f"{(r['utilisation'] or 0):.1%} of its rate while DCQCN held the queue",
                     name),
        ]
    else:
        median = r["queue"]["median_bytes"]
        checks.append(at_least(
            "without congestion control the queue fills", median, r["kmax_bytes"], "bytes",
            f"{r['senders']} QPs at line rate: median real queue {_kb(median)} against Kmax "
            f"{_kb(r['kmax_bytes'])} (PFC's XOFF {_kb(r['xoff_bytes'])})", name))
    checks.append(at_least("queue sampled", round(r["queue"]["sampled_fraction"], 4),
                           MIN_SAMPLED_FRACTION, "fraction of expected samples",
                           f"{r['queue']['samples']} samples in the judged window"
                           + (f"; the sampler stopped: {r['sampler_error']}"
                              if r["sampler_error"] else ""), name))
    return checks + capture_checks(r.get("capture"), name)


def dcqcn_checks(results: dict[str, dict]) -> list[Check]:
    checks: list[Check] = []
    for name, r in results.items():
        if "queue" in r:
            checks += setup_checks(name, r)
    return checks


def dcqcn_rows(results: dict[str, dict]) -> list[tuple[str, str]]:
    rows = []
    for name, r in results.items():
        if "queue" not in r:
            continue
        q, pfc = r["queue"], r["pfc"] or {}
        jain = "-" if r["jain"] is None else f"{r['jain']:.3f}"
        rows.append(Row(name, f"goodputs {', '.join(f'{x:.2f}' for x in r['goodput_mbit'])} "
                              f"Mbit/s (Jain {jain}); real queue median/p95 "
                              f"{_kb(q['median_bytes'])}/{_kb(q['p95_bytes'])} (Kmin "
                              f"{_kb(r['kmin_bytes'])}, Kmax {_kb(r['kmax_bytes'])}); "
                              f"utilisation {(r['utilisation'] or 0):.0%}; {r['marks']} marks; "
                              f"{pfc.get('pause_frames_sent')} pause frames",
                        *(Number(f"goodput QP {i}", x, "Mbit/s")
                          for i, x in enumerate(r["goodput_mbit"], 1)),
                        Number("Jain index", r["jain"], ""),
                        Number("queue median", q["median_bytes"], "bytes"),
                        Number("queue p95", q["p95_bytes"], "bytes"),
                        Number("utilisation", r["utilisation"], "fraction"),
                        Number("marks", r["marks"], ""),
                        Number("pause frames", pfc.get("pause_frames_sent"), "")))
        divergence = r.get("divergence")
        if divergence:
            rows.append((f"{name}: marker's model", f"mean |model - qdisc| "
                                                    f"{_kb(divergence['mean_abs_bytes'])}"))
    scaling = next((r["cc_scaling"] for r in results.values() if r.get("cc_scaling")), [])
    for row in scaling:
        rows.append((f"DCQCN {row['name']}", f"{row['value']:g} (paper {row['paper_value']:g}; "
                                             f"{row['rule']})"))
    rows += [(f"{name}: error", e) for name, r in results.items() for e in r.get("errors", [])]
    return rows
