"""The parameter server's figures: the backlog at the ports into the servers over time (one
panel per mode), and the comparison with AllReduce (step time, busiest link's bytes)."""
from __future__ import annotations

from pathlib import Path

from testbed.harness.plots import distinct_colours, legend_outside, pyplot, save


def plot_backlog(series: dict[str, dict], title: str, path: Path) -> Path:
    """``series``: mode -> {"t_s": [monotonic], "backlog_bytes": {intf: [bytes]}}."""
    plt = pyplot()
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 3.2 * len(series)), squeeze=False)
    for ax, (mode, s) in zip(axes[:, 0], series.items()):
        t0 = s["t_s"][0] if s["t_s"] else 0.0
        ports = s["backlog_bytes"]
        for (intf, values), colour in zip(ports.items(), distinct_colours(len(ports))):
            ax.plot([t - t0 for t in s["t_s"]], [v / 1000 for v in values], color=colour,
                    lw=0.8, label=intf)
        ax.set_ylabel("backlog (KB)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{mode}: the queue at each port into a server (real qdisc backlog)",
                     fontsize=9)
        legend_outside(ax, fontsize=7)
    axes[-1, 0].set_xlabel("time since sampling started (s)")
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def plot_comparison(phases: dict[str, dict], title: str, path: Path) -> Path:
    """Step time and the busiest link's bytes per step, one bar per phase."""
    plt = pyplot()
    names = list(phases)
    colours = distinct_colours(len(names))
    fig, (steps, links) = plt.subplots(1, 2, figsize=(11, 4))
    steps.bar(names, [phases[n]["step_s"] for n in names], color=colours)
    steps.set_ylabel("step time (s)")
    steps.set_title("step time", fontsize=9)
    links.bar(names, [phases[n]["busiest_link_bytes_per_step"] / 1000 for n in names],
              color=colours)
    links.set_ylabel("KB per step")
    links.set_title("bytes on the busiest link per step", fontsize=9)
    for ax in (steps, links):
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"{title}\nparameter server (each mode) against ring AllReduce, same "
                 "workers and model", fontsize=9)
    return save(fig, path)
