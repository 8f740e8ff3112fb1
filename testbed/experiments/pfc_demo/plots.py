"""pfc-demo's figure from its results: the victim's rate alone and beside the incast per run,
port-seconds paused by hop distance from the congested switch, and paused ports over time
(each run's series from its own folder, ``PAUSED_SERIES_FILE``)."""
from __future__ import annotations

import json
from pathlib import Path

from testbed.experiments.pfc_demo.checks import CONDITIONS

PAUSED_SERIES_FILE = "paused-ports.json"  # {"t_s": [...], "ports": [...]}, in each run's folder
CONDITION_COLOURS = {"lossy": "tab:red", "pfc": "tab:orange", "pfc+ecn": "tab:blue"}
ALONE_COLOUR, BESIDE_COLOUR = "tab:grey", "tab:purple"
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0), "fontsize": "small"}


def paused_series(result: dict) -> tuple[list[float], list[int]]:
    """A run's paused-ports series (seconds since the incast started), empty if it has none."""
    path = Path(result["dir"]) / PAUSED_SERIES_FILE
    if not path.exists():
        return [], []
    data = json.loads(path.read_text())
    return data["t_s"], data["ports"]


def plot_demo(results: dict[str, dict], title: str, what: str, path: Path) -> Path:
    """Three panels: the victim's rate per run (head-of-line blocking), port-seconds paused
    by hops from the congested switch (spreading), paused ports over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [c for c in CONDITIONS if c in results]
    fig, (victim, hops, series) = plt.subplots(1, 3, figsize=(17, 4.5))
    xs = range(len(runs))
    victim.bar([x - 0.2 for x in xs], [results[c]["victim_alone_mbit"] for c in runs], 0.4,
               color=ALONE_COLOUR, label="alone")
    victim.bar([x + 0.2 for x in xs], [results[c]["victim_mbit"] for c in runs], 0.4,
               color=BESIDE_COLOUR, label="beside the incast")
    victim.set_xticks(list(xs), runs)
    victim.set_xlabel("run")
    victim.set_ylabel("victim throughput (Mbit/s)")
    victim.set_title("head-of-line blocking", fontsize=9)
    victim.legend(**LEGEND)
    paused = [c for c in runs if results[c]["lossless_drops"] is not None]  # runs with PFC
    levels = sorted({row["hops"] for c in paused for row in results[c]["by_hop"]})
    width = 0.8 / max(len(paused), 1)
    for i, c in enumerate(paused):
        per_hop = {row["hops"]: row["paused_s"] for row in results[c]["by_hop"]}
        hops.bar([h + (i - (len(paused) - 1) / 2) * width for h in levels],
                 [per_hop.get(h, 0.0) for h in levels], width, color=CONDITION_COLOURS[c],
                 label=c)
        t, n = paused_series(results[c])
        series.step(t, n, where="post", color=CONDITION_COLOURS[c], label=c)
    hops.set_xticks(levels)
    hops.set_xlabel("hops from the congested switch")
    hops.set_ylabel("port-seconds paused (s)")
    hops.set_title("congestion spreading", fontsize=9)
    series.set_xlabel("time since the incast started (s)")
    series.set_ylabel("ports paused")
    series.set_title("pauses over time", fontsize=9)
    for ax in (hops, series):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(**LEGEND)
    fig.suptitle(f"{title}\n{what}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
