"""roce-loss's claims, judged from every setup's results, and its printed summary.

- zero loss: the RoCE flow's goodput is at least ``ZERO_LOSS_MIN_FRACTION`` of the link rate
  (a clean path runs at line rate: the headers take 5% at RoCE MTU 1024);
- loss: at the highest loss rate RoCE keeps a share of its loss-free goodput at most
  ``MAX_ROCE_SHARE_OF_TCP`` times the share TCP keeps of its own (go-back-N against SACK);
- every RoCE flow's data verified (the receiver's memory hashes as the sender's);
- the packet sample decodes as InfiniBand BTH in tshark and its ICRC verifies in scapy.
"""
from __future__ import annotations

from testbed.measure.roce import capture_checks, goodput_fraction, verified_check
from testbed.model.verdict import Check, at_least, at_most

# Named tolerances.
ZERO_LOSS_MIN_FRACTION = 0.90
# Go-back-N resends the whole window per loss: at 1% loss and 64 packets in flight RoCE
# keeps about 1 / (1 + 0.64), 0.6, of its goodput, while TCP keeps nearly all of its own.
# "Much faster" means RoCE keeps at most three quarters of the share TCP keeps.
MAX_ROCE_SHARE_OF_TCP = 0.75


def ordered(results: dict[str, dict]) -> list[dict]:
    """The setups that measured, by loss rate."""
    return sorted((r for r in results.values() if "loss_percent" in r),
                  key=lambda r: r["loss_percent"])


def kept_share(goodput: float | None, reference: float | None) -> float | None:
    """Goodput as a share of the loss-free goodput (None when either is unknown or 0)."""
    if goodput is None or not reference:
        return None
    return round(goodput / reference, 4)


def loss_checks(results: dict[str, dict], rate_mbit: float) -> list[Check]:
    runs = ordered(results)
    checks: list[Check] = []
    if not runs:
        return checks
    zero, worst = runs[0], runs[-1]
    if zero["loss_percent"] == 0:
        fraction = goodput_fraction(zero["roce_goodput_mbit"], rate_mbit)
        checks.append(at_least("RoCE goodput without loss", fraction, ZERO_LOSS_MIN_FRACTION,
                               "fraction of the link rate",
                               f"one RoCE QP carried {zero['roce_goodput_mbit'] or 0:.2f} Mbit/s "
                               f"of data over the {rate_mbit:g} Mbit/s link with no loss",
                               f"loss-{zero['loss_percent']:g}"))
    if worst is not zero and zero["loss_percent"] == 0:
        roce = kept_share(worst["roce_goodput_mbit"], zero["roce_goodput_mbit"])
        tcp = kept_share(worst["tcp_goodput_mbit"], zero["tcp_goodput_mbit"])
        ratio = None if roce is None or not tcp else round(roce / tcp, 4)
        checks.append(at_most(
            "RoCE's goodput falls faster than TCP's", ratio, MAX_ROCE_SHARE_OF_TCP,
            "RoCE's kept share / TCP's",
            f"at {worst['loss_percent']:g}% loss RoCE keeps {_pct(roce)} of its loss-free "
            f"goodput ({worst['roce_goodput_mbit'] or 0:.2f} Mbit/s, "
            f"{worst['roce'].get('retransmitted_packets')} packets retransmitted), TCP keeps "
            f"{_pct(tcp)} ({worst['tcp_goodput_mbit'] or 0:.2f} Mbit/s): go-back-N resends the "
            "window, SACK the lost segment", f"loss-{worst['loss_percent']:g}"))
    checks.append(verified_check([r["roce"] for r in runs]))
    captured = [r for r in runs if "capture" in r]
    checks += capture_checks(captured[0]["capture"] if captured else None,
                             f"loss-{(captured or runs)[0]['loss_percent']:g}")
    return checks


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def loss_rows(results: dict[str, dict]) -> list[tuple[str, str]]:
    """A row per loss rate: both goodputs, their kept shares and what the loss cost."""
    runs = ordered(results)
    zero = runs[0] if runs and runs[0]["loss_percent"] == 0 else None
    rows = []
    for r in runs:
        applied = r["applied_loss"]
        roce_share = kept_share(r["roce_goodput_mbit"], zero and zero["roce_goodput_mbit"])
        tcp_share = kept_share(r["tcp_goodput_mbit"], zero and zero["tcp_goodput_mbit"])
        rows.append((f"{r['loss_percent']:g}% loss",
                     f"RoCE {r['roce_goodput_mbit'] or 0:.2f} Mbit/s ({_pct(roce_share)}; "
                     f"{r['roce'].get('retransmitted_packets')} retransmitted, "
                     f"{r['roce'].get('naks')} NAKs, {r['roce'].get('timeouts')} timeouts); "
                     f"TCP {r['tcp_goodput_mbit'] or 0:.2f} Mbit/s ({_pct(tcp_share)}; "
                     f"{r['tcp_retransmitted_segments']} segments retransmitted); loss applied "
                     f"{applied['fraction']:.3%} ({applied['dropped']} of {applied['matched']})"))
    rows += [(f"{name}: error", error) for name, r in results.items()
             for error in r.get("errors", [])]
    return rows
