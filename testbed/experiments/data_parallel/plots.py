"""The scaling figure: step time against workers (measured, predicted, compute alone), and
scaling efficiency and communication shares against workers, one colour per model."""
from __future__ import annotations

from pathlib import Path

from testbed.harness.plots import distinct_colours, legend_outside, pyplot, save


def plot_scaling(runs: list[dict], title: str, path: Path) -> Path:
    plt = pyplot()
    fig, (steps, shares) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    models = list(dict.fromkeys(x["model"] for x in runs))
    for model, colour in zip(models, distinct_colours(len(models))):
        mine = [x for x in runs if x["model"] == model]
        workers = [x["workers"] for x in mine]
        steps.plot(workers, [x["step_s"] for x in mine], "o-", color=colour,
                   label=f"{model} measured")
        steps.plot(workers, [x["predicted_step_s"] for x in mine], "--", color=colour,
                   label=f"{model} predicted")
        steps.plot(workers, [x["compute_s"] for x in mine], ":", color=colour,
                   label=f"{model} compute alone")
        shares.plot(workers, [100 * x["scaling_efficiency"] for x in mine], "o-", color=colour,
                    label=f"{model} scaling efficiency")
        shares.plot(workers, [100 * x["predicted_scaling_efficiency"] for x in mine], "--",
                    color=colour, label=f"{model} efficiency predicted")
        shares.plot(workers, [100 * x["exposed_share"] for x in mine], "s-.", color=colour,
                    ms=4, label=f"{model} exposed communication")
    steps.set_ylabel("step time (s)")
    steps.set_ylim(bottom=0)
    steps.set_title(f"{title}\ndata-parallel step time as workers grow: measured (solid), "
                    "cost model with DDP's overlap (dashed)", fontsize=9)
    legend_outside(steps, fontsize=7)
    shares.set_xscale("log", base=2)
    shares.set_xticks(sorted({x["workers"] for x in runs}),
                      [str(w) for w in sorted({x["workers"] for x in runs})])
    shares.set_xlabel("workers")
    shares.set_ylabel("% (efficiency: compute / step)")
    shares.set_ylim(0, 105)
    legend_outside(shares, fontsize=7)
    return save(fig, path)
