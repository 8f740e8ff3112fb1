"""roce-loss's figure: goodput against loss rate, RoCE and TCP, absolute and as the share of
each one's loss-free goodput."""
from __future__ import annotations

from pathlib import Path

from testbed.experiments.roce_loss.checks import kept_share, ordered
from testbed.harness.plots import distinct_styles, legend_outside, pyplot, save

ZERO_AT = 1e-3  # where 0% loss is drawn on the logarithmic axis (in %)


def plot_goodput(results: dict[str, dict], rate_mbit: float, title: str, path: Path) -> Path:
    plt = pyplot()
    runs = ordered(results)
    x = [r["loss_percent"] or ZERO_AT for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    (roce_colour, _), (tcp_colour, _) = distinct_styles(2)
    for key, label, colour in (("roce_goodput_mbit", "RoCE (go-back-N)", roce_colour),
                               ("tcp_goodput_mbit", "TCP (iperf3)", tcp_colour)):
        y = [r[key] for r in runs]
        left.plot(x, y, marker="o", color=colour, label=label)
        right.plot(x, [kept_share(v, y[0]) for v in y], marker="o", color=colour, label=label)
    left.axhline(rate_mbit, color="k", ls=":", lw=1, label="link rate")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel(f"random loss per direction (%; 0 drawn at {ZERO_AT:g})")
    left.set_ylabel("goodput (Mbit/s)")
    right.set_ylabel("share of the loss-free goodput")
    right.set_ylim(0, 1.05)
    fig.suptitle(f"{title}\ngoodput under random loss", fontsize=9)
    legend_outside(right, fontsize=8)
    return save(fig, path)
