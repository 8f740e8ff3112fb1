"""roce-incast-pfc's claims and printed summary.

- every setup: zero drops in the lossless queues (switches and hosts: PFC's claim), data
  verified on every flow, the packet sample decoded as InfiniBand BTH with its ICRC
  verified;
- with both setups: ``pfc+dcqcn`` sends at most ``MAX_PAUSE_SHARE`` of the pause frames
  ``pfc`` sends (DCQCN's marks slow the senders before the queue reaches XOFF). Zhu et al.
  show pauses all but gone with DCQCN; half leaves room for the emulated pause path, whose
  reaction is slower than hardware's.
"""
from __future__ import annotations

from testbed.measure.roce import capture_checks, verified_check
from testbed.model.verdict import Check, at_most, near

PFC, PFC_DCQCN = "pfc", "pfc+dcqcn"
# Named tolerances.
LOSSLESS_DROPS_TOLERANCE = 0
MAX_PAUSE_SHARE = 0.5


def incast_checks(results: dict[str, dict]) -> list[Check]:
    checks: list[Check] = []
    for name, r in results.items():
        if "pfc" not in r or r["pfc"] is None:
            continue
        drops = r["pfc"]["lossless_drops"]
        checks += [
            near("no drops in the lossless class", drops, 0, LOSSLESS_DROPS_TOLERANCE,
                 "packets", f"{r['senders']}:1 RoCE incast ({name}): {drops} packets dropped by "
                 f"the lossless queues of every switch port and host NIC; "
                 f"{r['pfc']['pause_frames_sent']} pause frames kept it lossless", name),
            verified_check(r["flows"], name),
            *capture_checks(r.get("capture"), name),
        ]
    if PFC in results and PFC_DCQCN in results and results[PFC].get("pfc") \
            and results[PFC_DCQCN].get("pfc"):
        alone = results[PFC]["pfc"]["pause_frames_sent"]
        with_dcqcn = results[PFC_DCQCN]["pfc"]["pause_frames_sent"]
        share = round(with_dcqcn / alone, 4) if alone else None
        checks.append(at_most("DCQCN cuts PFC's pauses", share, MAX_PAUSE_SHARE,
                              "pause frames with DCQCN / with PFC alone",
                              f"{with_dcqcn} pause frames with DCQCN against {alone} with PFC "
                              f"alone ({results[PFC_DCQCN]['pfc']['paused_s']:.2f} against "
                              f"{results[PFC]['pfc']['paused_s']:.2f} port-seconds paused)"
                              + ("" if alone else "; PFC alone sent none, so there is nothing "
                                 "to cut"), PFC_DCQCN))
    return checks


def incast_rows(results: dict[str, dict]) -> list[tuple[str, str]]:
    rows = []
    for name, r in results.items():
        if "queue" not in r:
            continue
        pfc, q = r["pfc"] or {}, r["queue"]
        median = q["median_bytes"]
        rows.append((name, f"{pfc.get('lossless_drops')} lossless drops, "
                           f"{pfc.get('pause_frames_sent')} pause frames, "
                           f"{pfc.get('paused_s', 0):.2f} port-s paused; goodputs "
                           f"{sum(r['goodput_mbit']):.2f} Mbit/s in all (Jain "
                           f"{(r['jain'] or 0):.3f}); real queue median "
                           f"{'-' if median is None else f'{median / 1000:.1f} KB'} (XOFF "
                           f"{r['xoff_bytes'] / 1000:.1f} KB); {r['marks']} marks"))
    rows += [(f"{name}: error", e) for name, r in results.items() for e in r.get("errors", [])]
    return rows
