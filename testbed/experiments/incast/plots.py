"""Incast's figures from its results (each mode's measurements and summaries): query and flow
completion per mode at the largest fan-in, and completion against fan-in for a sweep."""
from __future__ import annotations

import math
from pathlib import Path

from testbed.experiments.incast.checks import MODES
from testbed.experiments.incast.summary import ideal_round_s

MODE_COLOURS = {"droptail": "tab:red", "ecn": "tab:blue", "pfc": "tab:green"}
IDEAL_COLOUR = "grey"
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0), "fontsize": "small"}
DPI = 120


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_completion(results: dict[str, dict], response_bytes: int, rate_mbit: float,
                    title: str, path: Path) -> Path:
    """At the largest fan-in: each mode's query completion times (box plot, with the ideal)
    and the CDF of its per-flow completion times."""
    plt = _pyplot()
    fanin = max(m["fanin"] for r in results.values() for m in r["measurements"])
    top = [(mode, m) for mode in MODES if mode in results
           for m in results[mode]["measurements"] if m["fanin"] == fanin]
    fig, (box, cdf) = plt.subplots(1, 2, figsize=(12, 4.5))
    parts = box.boxplot([m["round_s"] or [math.nan] for _, m in top],
                        tick_labels=[mode for mode, _ in top], patch_artist=True)
    for patch, (mode, _) in zip(parts["boxes"], top):
        patch.set_facecolor(MODE_COLOURS[mode])
        patch.set_alpha(0.5)
    box.axhline(ideal_round_s(fanin, response_bytes, rate_mbit), linestyle=":",
                color=IDEAL_COLOUR, label="ideal (payload at link rate)")
    box.set_xlabel("queue mode")
    box.set_ylabel("query completion time (s)")
    box.set_title(f"query completion, fan-in {fanin}", fontsize=9)
    box.legend(**LEGEND)
    for mode, m in top:
        flows = sorted(t for r in m["flow_s"] for t in r)
        if flows:
            cdf.step(flows, [(i + 1) / len(flows) for i in range(len(flows))], where="post",
                     color=MODE_COLOURS[mode], label=mode)
    cdf.set_xlabel("flow completion time (s)")
    cdf.set_ylabel("fraction of flows")
    cdf.set_title(f"per-flow completion, fan-in {fanin}", fontsize=9)
    if cdf.get_legend_handles_labels()[0]:
        cdf.legend(**LEGEND)
    fig.suptitle(f"{title}\nincast: {response_bytes} B per response", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_fanin_sweep(results: dict[str, dict], response_bytes: int, rate_mbit: float,
                     title: str, path: Path) -> Path | None:
    """Median and p99 query completion against fan-in, per mode, beside the ideal; None
    with a single fan-in."""
    fanins = sorted({s["fanin"] for r in results.values() for s in r["summaries"]})
    if len(fanins) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for mode in MODES:
        own = sorted((s for s in results.get(mode, {}).get("summaries", [])
                      if s["round"]["count"]), key=lambda s: s["fanin"])
        if not own:
            continue
        xs = [s["fanin"] for s in own]
        colour = MODE_COLOURS[mode]
        ax.plot(xs, [s["round"]["median_s"] for s in own], marker="o", color=colour,
                label=f"{mode} median")
        ax.plot(xs, [s["round"]["p99_s"] for s in own], marker="x", linestyle="--",
                color=colour, label=f"{mode} p99")
    ax.plot(fanins, [ideal_round_s(n, response_bytes, rate_mbit) for n in fanins],
            linestyle=":", color=IDEAL_COLOUR, label="ideal")
    ax.set_xlabel("fan-in (senders)")
    ax.set_ylabel("query completion time (s)")
    ax.set_xticks(fanins)
    ax.set_title(f"{title}\nincast: completion against fan-in", fontsize=9)
    ax.legend(**LEGEND)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
