"""The placements' figure: each placement's step split into compute and communication, the
prediction beside it, and the ratios in the title."""
from __future__ import annotations

from pathlib import Path

from testbed.harness.plots import legend_outside, pyplot, save

COMPUTE_COLOUR, COMM_COLOUR, PREDICTED_COLOUR = "#9ecae1", "#e6550d", "black"


def plot_placements(placements: dict[str, dict], comparison: dict | None, title: str,
                    path: Path) -> Path:
    plt = pyplot()
    names = list(placements)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    compute = [placements[n]["compute_s"] for n in names]
    comm = [placements[n]["comm_s"] for n in names]
    ax.bar(names, compute, color=COMPUTE_COLOUR, label="compute")
    ax.bar(names, comm, bottom=compute, color=COMM_COLOUR, label="AllReduce (communication)")
    ax.scatter(names, [placements[n]["predicted_step_s"] for n in names], marker="D",
               color=PREDICTED_COLOUR, zorder=3, label="predicted step")
    ax.set_ylabel("step time (s)")
    subtitle = "tensor-parallel step inside one node vs across nodes"
    if comparison is not None and comparison["bandwidth_ratio"]:
        subtitle += (f": bandwidth ratio {comparison['bandwidth_ratio']:g}, communication "
                     f"{comparison['comm_ratio']:.2f}x, step {comparison['step_ratio']:.2f}x")
    ax.set_title(f"{title}\n{subtitle}", fontsize=9)
    legend_outside(ax, fontsize=8)
    return save(fig, path)
