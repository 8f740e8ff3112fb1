"""The replay's figure: when the trace completed as recorded, replayed on the recording
fabric, and replayed on the replay fabric."""
from __future__ import annotations

from pathlib import Path

from testbed.harness.plots import distinct_colours, pyplot, save


def plot_completion(results: dict[str, dict], title: str, path: Path) -> Path:
    plt = pyplot()
    first = next(iter(results.values()))["replay"]
    labels = ["recorded", *(f"replayed on {name}" for name in results)]
    values = [first["recorded_completion_s"],
              *(r["replay"]["replayed_completion_s"] for r in results.values())]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(labels, values, color=distinct_colours(len(labels)))
    for x, v in enumerate(values):
        ax.text(x, v, f"{v:.2f} s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("completion of the trace (s after its first send)")
    ax.set_title(f"{title}\nthe recorded trace: its completion as recorded and as replayed with "
                 "its original timing", fontsize=9)
    return save(fig, path)
