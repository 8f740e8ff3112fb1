"""roce-dctcp's claims and printed summary. Per setup, over the judged window:

- the median real queue (the bottleneck's buffer backlog, every 10 ms) is within
  ``K_TOLERANCE_FRAMES`` full RoCE frames of K (the senders react one RTT after a mark, so
  the queue rides a few frames about K);
- the bottleneck carries at least ``MIN_UTILISATION`` of its rate (DCTCP's claim: the short
  queue costs no throughput);
- the queue is sampled (at least ``MIN_SAMPLED_FRACTION`` of the expected samples), data
  verified on every flow, the packet sample decoded with its ICRC verified.
"""
from __future__ import annotations

from testbed.measure.roce import capture_checks, verified_check
from testbed.model.verdict import Check, at_least, near

# Named tolerances.
K_TOLERANCE_FRAMES = 3
MIN_UTILISATION = 0.90
MIN_SAMPLED_FRACTION = 0.5


def dctcp_checks(results: dict[str, dict]) -> list[Check]:
    checks: list[Check] = []
    for name, r in results.items():
        if "queue" not in r:
            continue
        q = r["queue"]
        median, k = q["median_bytes"], r["k_bytes"]
        util = r["utilisation"]
        checks += [
            near("median queue near K", None if median is None else round(median, 1), k,
                 K_TOLERANCE_FRAMES * r["frame_bytes"], "bytes",
                 f"{r['senders']} QPs: median real queue {median} B (p95 {q['p95_bytes']} B) "
                 f"of {r['bottleneck']} against K = {k} B, within {K_TOLERANCE_FRAMES} frames "
                 f"of {r['frame_bytes']} B", name),
            at_least("utilisation with the short queue", None if util is None
                     else round(util, 4), MIN_UTILISATION, "fraction of the link rate",
                     f"the bottleneck carried {(util or 0):.1%} of {r['rate_mbit']:g} Mbit/s "
                     f"({r['marks']} marks)", name),
            at_least("queue sampled", round(q["sampled_fraction"], 4), MIN_SAMPLED_FRACTION,
                     "fraction of expected samples", f"{q['samples']} samples"
                     + (f"; the sampler stopped: {r['sampler_error']}" if r["sampler_error"]
                        else ""), name),
            verified_check(r["flows"], name),
            *capture_checks(r.get("capture"), name),
        ]
    return checks


def dctcp_rows(results: dict[str, dict]) -> list[tuple[str, str]]:
    rows = []
    for name, r in results.items():
        if "queue" not in r:
            continue
        q = r["queue"]
        rows.append((name, f"real queue median/p95 {q['median_bytes']}/{q['p95_bytes']} B "
                           f"against K {r['k_bytes']} B; utilisation "
                           f"{(r['utilisation'] or 0):.1%}; goodputs "
                           f"{', '.join(f'{x:.2f}' for x in r['goodput_mbit'])} Mbit/s; "
                           f"{r['marks']} marks"))
        if r.get("divergence"):
            rows.append((f"{name}: marker's model", f"mean |model - qdisc| "
                                                    f"{r['divergence']['mean_abs_bytes']:.0f} B"))
        scaling = ((r.get("queue_record") or {}).get("ecn") or [None])[0]
        if scaling:
            rows.append((f"{name}: K", f"{scaling['value']} B ({scaling['anchor']}; decided "
                                       f"by {scaling['decided_by']})"))
    rows += [(f"{name}: error", e) for name, r in results.items() for e in r.get("errors", [])]
    return rows
