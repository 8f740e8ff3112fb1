"""Figures the RoCE experiments share: each flow's congestion control over time (rate or
window, alpha, CNPs) from testbed.measure.roce.cc_series, and a switch port's real queue over
time with its thresholds. Every figure's title starts with the harness's prefix."""
from __future__ import annotations

from pathlib import Path

from testbed.drive.roce_flows import CC_FILE, QUEUE_FILE
from testbed.harness.plots import distinct_styles, legend_outside, pyplot, save

KB = 1000.0


def plot_cc(flows: dict[str, dict], origin_s: float, title: str, path: Path) -> Path:
    """Per flow (label -> cc_series): its rate in Mbit/s (DCQCN, none) or window in KB
    (DCTCP-style) on top, alpha in the middle, CNPs received (and, dashed, sent by its
    receiver's NP) at the bottom; time in seconds since ``origin_s`` (CLOCK_MONOTONIC)."""
    plt = pyplot()
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    windowed = False
    for (label, flow), (colour, style) in zip(flows.items(), distinct_styles(len(flows))):
        s = flow["series"]
        t = [x - origin_s for x in s.get("t_s", [])]
        if "cwnd_bytes" in s:
            windowed = True
            top.step(t, [w / KB for w in s["cwnd_bytes"]], where="post", color=colour,
                     ls=style, lw=0.9, label=label)
        elif "rate_bps" in s:
            top.step(t, [None if r is None else r / 1e6 for r in s["rate_bps"]], where="post",
                     color=colour, ls=style, lw=0.9, label=label)
        if "alpha" in s:
            mid.step(t, s["alpha"], where="post", color=colour, ls=style, lw=0.9, label=label)
        if "cnps_received" in s:
            low.step(t, s["cnps_received"], where="post", color=colour, ls=style, lw=0.9,
                     label=f"{label} received")
        sent = flow.get("cnps_sent") or {}
        if sent.get("t_s"):
            low.step([x - origin_s for x in sent["t_s"]], sent["count"], where="post",
                     color=colour, ls="--", lw=0.7, label=f"{label} sent by NP")
    top.set_ylabel("window (KB)" if windowed else "rate (Mbit/s)")
    mid.set_ylabel("alpha")
    low.set_ylabel("CNPs (cumulative)")
    low.set_xlabel("time since the flows started (s)")
    top.set_title(f"{title}\ncongestion control per QP", fontsize=9)
    for ax in (top, mid, low):
        if ax.lines:
            legend_outside(ax, fontsize=7)
    return save(fig, path)


def plot_queue(t_s: list[float], depth_bytes: list[int], origin_s: float,
               thresholds: dict[str, float], title: str, path: Path,
               label: str = "real backlog (qdisc)") -> Path:
    """A port's real queue over time (seconds since ``origin_s``) with named thresholds
    (K, Kmin, Kmax, XOFF, buffer) as horizontal lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([t - origin_s for t in t_s], [d / KB for d in depth_bytes], lw=0.8, label=label)
    styles = distinct_styles(len(thresholds) + 1)[1:]
    for (name, value), (colour, _) in zip(thresholds.items(), styles):
        ax.axhline(value / KB, color=colour, ls="--", lw=1, label=f"{name} {value / KB:g} KB")
    ax.set_xlabel("time since the flows started (s)")
    ax.set_ylabel("queue (KB)")
    ax.set_title(title, fontsize=9)
    legend_outside(ax, fontsize=7)
    return save(fig, path)


def plot_setup_series(name: str, result: dict, thresholds: dict[str, float], title: str,
                      folder: Path) -> list[Path]:
    """One bottleneck setup's figures (testbed.drive.roce_flows.measure_bottleneck's
    files in its folder): the real queue with ``thresholds``, and every QP's control."""
    import json

    run_dir = Path(result["dir"])
    origin = result["flows_monotonic_s"][0]
    paths = []
    queue_file, cc_file = run_dir / QUEUE_FILE, run_dir / CC_FILE
    if queue_file.exists():
        queue = json.loads(queue_file.read_text())
        paths.append(plot_queue(queue["t_s"], queue["qdisc_bytes"], origin, thresholds,
                                f"{title} | {name}\n{result['bottleneck']} toward the "
                                f"receiver, sampled every 10 ms", folder / f"queue-{name}.png"))
    if cc_file.exists():
        paths.append(plot_cc(json.loads(cc_file.read_text()), origin, f"{title} | {name}",
                             folder / f"cc-{name}.png"))
    return paths
