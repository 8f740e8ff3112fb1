"""torch DDP's steps: each measured step (the slowest rank), the generator's prediction for
the same parameter shapes, and the compute alone."""
from __future__ import annotations

from pathlib import Path

from testbed.harness.plots import legend_outside, pyplot, save


def plot_steps(r: dict, title: str, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    steps = list(range(1, len(r["job_step_s"]) + 1))
    ax.plot(steps, [1e3 * s for s in r["job_step_s"]], "o-", color="tab:blue",
            label="measured step (slowest rank)")
    if r["predicted_step_s"] is not None:
        ax.axhline(1e3 * r["predicted_step_s"], color="tab:orange", ls="--",
                   label="generator's prediction")
    ax.axhline(1e3 * (r["forward_s"] + r["backward_s"] + r["optimizer_s"]), color="tab:green",
               ls=":", label="compute alone")
    ax.set_xlabel("measured step")
    ax.set_ylabel("time (ms)")
    ax.set_ylim(bottom=0)
    ax.set_xticks(steps)
    ax.set_title(f"{title}\ntorch DDP (gloo), {r['world']} ranks, {r['params']} parameters",
                 fontsize=9)
    legend_outside(ax, fontsize=8)
    return save(fig, path)
