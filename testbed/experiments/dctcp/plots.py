"""The DCTCP micro-benchmark's figures, drawn from a run's results and each setup's
queue.json (so a finished run can be redrawn: testbed.experiments.dctcp.replot):

- queue_time.png: the bottleneck queue over time, one panel per sender count, drop-tail
  against ECN; the real backlog solid, the eBPF marker's model of it dashed; K and the
  buffer as lines; TCP start-up (not judged) shaded;
- queue_cdf.png: the real queue's CDF over the judged window, one panel per sender count.
"""
from __future__ import annotations

from pathlib import Path

from testbed.experiments.dctcp.bench import (
    DROPTAIL,
    ECN,
    QUEUE_FILE,
    QUEUEING_NAMES,
    read_queue_samples,
    tcp_label,
    window_samples,
)

# (real backlog, the marker's model) colours per queueing
COLOURS = {DROPTAIL: ("tab:red", "tab:orange"), ECN: ("tab:blue", "tab:cyan")}
K_STYLE = {"color": "black", "ls": "--", "lw": 1}
BUFFER_STYLE = {"color": "tab:gray", "ls": ":", "lw": 1}
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0), "fontsize": 8}


def by_senders(results: dict[str, dict]) -> dict[int, list[dict]]:
    """{senders: [setup results...]} for the setups that measured, in the order they ran."""
    grouped: dict[int, list[dict]] = {}
    for r in results.values():
        if "queue" in r:
            grouped.setdefault(r["senders"], []).append(r)
    return grouped


def _reference_lines(ax, r: dict, horizontal: bool) -> None:
    """K (ECN) and the buffer (drop-tail) across a panel, in packets."""
    line = ax.axhline if horizontal else ax.axvline
    mtu = r["mtu_bytes"]
    if r["k_bytes"] is not None:
        line(r["k_bytes"] / mtu, label=f"K = {r['k_bytes'] / mtu:.1f} packets", **K_STYLE)
    if r["queueing"] == DROPTAIL:
        line(r["buffer_bytes"] / mtu, label=f"buffer = {r['buffer_bytes'] / mtu:.0f} packets",
             **BUFFER_STYLE)


def plot_queues(results: dict[str, dict], folder: Path, title: str) -> list[Path]:
    """queue_time.png and queue_cdf.png in ``folder``; none when no setup measured."""
    groups = by_senders(results)
    if not groups:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = len(groups)
    time_fig, time_axes = plt.subplots(count, 1, figsize=(11, 3.2 * count + 0.8),
                                       squeeze=False)
    cdf_fig, cdf_axes = plt.subplots(1, count, figsize=(5.5 * count + 2.5, 4.2), squeeze=False)
    for col, (n, runs) in enumerate(groups.items()):
        t_ax, c_ax = time_axes[col][0], cdf_axes[0][col]
        for r in runs:
            samples = read_queue_samples(Path(r["dir"]) / QUEUE_FILE)
            mtu = r["mtu_bytes"]
            real, model = COLOURS[r["queueing"]]
            name = f"{QUEUEING_NAMES[r['queueing']]} ({tcp_label(r['tcp'])})"
            t_ax.plot(samples["t_s"], [d / mtu for d in samples["qdisc_bytes"]], lw=0.7,
                      color=real, label=f"{name}: qdisc backlog")
            if samples.get("marker_bytes") is not None:
                t_ax.plot(samples["t_s"], [d / mtu for d in samples["marker_bytes"]], lw=0.7,
                          ls="--", color=model, label=f"{name}: marker's model")
            _, judged = window_samples(samples["t_s"], samples["qdisc_bytes"], r["window_s"])
            ranked = sorted(d / mtu for d in judged)
            if ranked:
                c_ax.step(ranked, [(i + 1) / len(ranked) for i in range(len(ranked))],
                          where="post", color=real, label=f"{name}: qdisc backlog")
            _reference_lines(t_ax, r, horizontal=True)
            _reference_lines(c_ax, r, horizontal=False)
            t_ax.axvspan(0, r["window_s"][0], color="0.92", lw=0)
        rate = runs[0]["rate_mbit"]
        t_ax.set_title(f"{n} senders -> 1 receiver, {rate:g} Mbit/s bottleneck", fontsize=9)
        t_ax.set_xlabel("time since the flows started (s); shaded: TCP start-up, not judged")
        t_ax.set_ylabel("queue (packets)")
        t_ax.set_ylim(bottom=0)
        t_ax.legend(**LEGEND)
        c_ax.set_title(f"{n} senders, judged window", fontsize=9)
        c_ax.set_xlabel("queue (packets)")
        c_ax.set_ylabel("fraction of samples")
        c_ax.set_ylim(0, 1.02)
        c_ax.legend(**LEGEND)
    time_fig.suptitle(f"{title}\nbottleneck queue over time, sampled every 10 ms", fontsize=9)
    cdf_fig.suptitle(f"{title}\nbottleneck queue (qdisc backlog), CDF over the judged window",
                     fontsize=9)
    paths = []
    for fig, name in ((time_fig, "queue_time.png"), (cdf_fig, "queue_cdf.png")):
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        paths.append(folder / name)
    return paths
