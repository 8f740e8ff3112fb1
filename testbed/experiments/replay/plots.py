"""The replay's figure: when the trace completed as recorded, replayed on the recording
fabric, and replayed on the replay fabric."""
from __future__ import annotations

from pathlib import Path

from testbed.harness.plots import pyplot, save

RECORDED_COLOUR = "#9ecae1"


def plot_completion(results: dict[str, dict], title: str, path: Path) -> Path:
    plt = pyplot()
    labels, values, colours = [], [], []
    palette = pyplot().get_cmap("tab10").colors
    first = next(iter(results.values()))["replay"]
    labels.append("recorded")
    values.append(first["recorded_completion_s"])
    colours.append(RECORDED_COLOUR)
    for i, (name, r) in enumerate(results.items()):
        labels.append(f"replayed on {name}")
        values.append(r["replay"]["replayed_completion_s"])
        colours.append(palette[i % len(palette)])
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(labels, values, color=colours)
    for x, v in enumerate(values):
        ax.text(x, v, f"{v:.2f} s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("completion of the trace (s after its first send)")
    ax.set_title(f"{title}\nthe recorded trace: its completion as recorded and as replayed with "
                 "its original timing", fontsize=9)
    return save(fig, path)
