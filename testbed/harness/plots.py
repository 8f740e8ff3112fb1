"""Figures every experiment can draw from what the harness measures: the fabric, link rates
and CPU over time, per-link utilisation, the switches' own port counters over OpenFlow, and
queue depths. Each takes the title prefix the harness gives (run, topology, rate) and writes
one PNG. ``caption_for`` gives every figure its one-line caption: the experiment's
(``Experiment.captions``), the harness's own, or a default."""
from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

from testbed.measure.openflow import link_rate_series
from testbed.model.records import port_samples, read_json_lines
from testbed.model.topology.base import Fabric
from testbed.model.topology.describe import draw

OPENFLOW_PLOT_LINKS = 12  # link directions drawn in the OpenFlow utilisation plot
BUSIEST_BARS = 15         # link directions named in the utilisation plot
LINE_STYLES = ("-", "--", ":", "-.")
# Okabe and Ito's palette: hues that stay apart with every common colour-vision deficiency.
COLOUR_BLIND_SAFE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                     "#F0E442", "#000000")


# Captions of the figures the harness draws for every run, by file name (a glob).
HARNESS_CAPTIONS = {
    "topology*.png": "The fabric as built: node roles by marker shape, link width by rate; "
                     "the tiers and counts should match the scenario.",
    "weathermap*.png": "Each link coloured by its busier direction's utilisation (dark "
                       "purple: idle, yellow: at the link rate); hot links beside idle ones "
                       "are uneven load balancing.",
    "faults*.png": "The busiest links' utilisation from the switches' own counters, each "
                   "fault's window shaded: load should shift or dip inside a window and "
                   "recover after its heal.",
}
DEFAULT_CAPTION = "What the figure shows is in its title; the checks above say what it means."


def caption_for(path, captions: dict[str, str] | None = None) -> str:
    """The one-line caption of a figure, by its file name: the first glob of ``captions``
    (an experiment's) or of the harness's that matches, else the default."""
    name = Path(path).name
    for table in (captions or {}, HARNESS_CAPTIONS):
        for pattern, caption in table.items():
            if fnmatch(name, pattern):
                return caption
    return DEFAULT_CAPTION


def pyplot():
    """matplotlib's pyplot on the file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def distinct_styles(n: int) -> list[tuple]:
    """(colour, line style) pairs that stay distinct for ``n`` lines: 20 colours, then the
    same colours dashed, dotted..."""
    colours = pyplot().get_cmap("tab20").colors
    return [(colours[i % len(colours)], LINE_STYLES[(i // len(colours)) % len(LINE_STYLES)])
            for i in range(n)]


def distinct_colours(n: int) -> list[tuple]:
    """``n`` colours of clearly different hues (tab10's, repeating after 10): for a few
    series, where ``distinct_styles``' neighbouring light and dark shades look alike."""
    colours = pyplot().get_cmap("tab10").colors
    return [colours[i % len(colours)] for i in range(n)]


def legend_outside(ax, **kwargs) -> None:
    """The legend to the right of the axes, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, **kwargs)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path


def fault_spans(windows: list[dict], t0_monotonic_s: float,
                end_s: float) -> list[tuple[float, float, str]]:
    """Fault windows (testbed.plan.fault_schedule.fault_windows, CLOCK_MONOTONIC) as
    (start, end, what) in seconds since ``t0_monotonic_s``; a fault never healed lasts to
    ``end_s``, an event without a heal has no length."""
    spans = []
    for w in windows:
        start = w["start_monotonic_s"] - t0_monotonic_s
        end = end_s if w["end_monotonic_s"] is None else w["end_monotonic_s"] - t0_monotonic_s
        spans.append((start, max(start, end), w["fault"]))
    return spans


def shade_faults(axes, spans: list[tuple[float, float, str]]) -> None:
    """Each fault's window shaded red on every axis (Jepsen's nemesis bands), an event
    without length as a red line; labelled once, on the first axis's legend."""
    for i, ax in enumerate(axes):
        for j, (start, end, what) in enumerate(spans):
            label = (what if len(spans) <= 4 else "faults" if j == 0 else None) if i == 0 else None
            if end > start:
                ax.axvspan(start, end, color="tab:red", alpha=0.15, label=label)
            else:
                ax.axvline(start, color="tab:red", lw=1.2, ls="-.", label=label)


def plot_openflow_utilisation(fabric: Fabric, port_stats_path: Path, window_monotonic_s,
                              title: str, path: Path,
                              most: int = OPENFLOW_PLOT_LINKS,
                              faults: list[dict] | None = None) -> Path | None:
    """Utilisation over time of the busiest link directions, from the switches' own port
    counters as the controller polled them over OpenFlow (port-stats.jsonl), with each
    fault's window shaded (``faults``: fault windows); None when the run polled nothing."""
    series = link_rate_series(fabric, port_samples(read_json_lines(port_stats_path)))
    series = {label: points for label, points in series.items() if points}
    if not series:
        return None
    rate = {}
    for link in fabric.links:
        rate[f"{link.a}->{link.b}"] = rate[f"{link.b}->{link.a}"] = link.rate_mbit
    t0 = min(points[0].t0_s for points in series.values())
    busiest = sorted(series, key=lambda k: -max(p.mbit for p in series[k]))[:most]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for label, (colour, style) in zip(busiest, distinct_styles(len(busiest))):
        points = series[label]
        scale = 100 / rate[label] if rate.get(label) else 0.0
        ax.step([p.t1_s - t0 for p in points], [p.mbit * scale for p in points], where="pre",
                lw=1.0, color=colour, linestyle=style, label=label)
    if window_monotonic_s:
        ax.axvspan(window_monotonic_s[0] - t0, window_monotonic_s[1] - t0, color="tab:green",
                   alpha=0.1, label="measured window")
    if faults:
        shade_faults([ax], fault_spans(faults, t0, max(p.t1_s for pts in series.values()
                                                        for p in pts) - t0))
    ax.axhline(100, color="black", lw=0.8, ls="--", label="link rate")
    ax.set_xlabel("time since the first poll (s)")
    ax.set_ylabel("utilisation (% of the link rate)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}\nthe {len(busiest)} busiest link directions, from the switches' own "
                 "port counters (OpenFlow), rates over the switches' counter times"
                 + ("; red: faults" if faults else ""), fontsize=9)
    legend_outside(ax, fontsize=7)
    return save(fig, path)


def busiest_ports(queue_samples: dict, most: int) -> list[str]:
    """The ``most`` ports with the largest mean sampled queue, busiest first; idle ones left out."""
    means = {intf: sum(d) / len(d) for intf, d in queue_samples["depth_bytes"].items() if any(d)}
    return sorted(means, key=lambda intf: -means[intf])[:most]


def plot_queue_depth(queue_samples: dict, ecn: dict, title: str, path: Path,
                     most: int = 8) -> Path:
    """Queue depth over time of the busiest switch ports, with where marking starts."""
    plt = pyplot()

    t = queue_samples["t_s"]
    fig, ax = plt.subplots(figsize=(9, 4))
    for intf in busiest_ports(queue_samples, most):
        ax.plot(t, [d / 1000 for d in queue_samples["depth_bytes"][intf]], lw=0.8, label=intf)
    starts = ecn["marking_starts_bytes"]  # per port where the links run at several rates
    starts = sorted(set(starts.values())) if isinstance(starts, dict) else [starts]
    buffers = sorted({q["buffer_bytes"] for q in ecn["queue"].get("rates", [ecn["queue"]])})
    for levels, style, label in ((starts, {"color": "k", "ls": "--"}, "marking starts"),
                                 (buffers, {"color": "tab:red", "ls": ":"}, "buffer")):
        for i, level in enumerate(level for level in levels if level is not None):
            ax.axhline(level / 1000, lw=1, label=label if i == 0 else None, **style)
    ax.set_xlabel("time since start of sampling (s)")
    ax.set_ylabel("queue (KB)")
    ax.set_title(f"{title}\nswitch egress queues ({ecn['path']}), sampled every "
                 f"{ecn['sample_ms']:g} ms", fontsize=9)
    legend_outside(ax, fontsize=7)
    return save(fig, path)


def plot_timeseries(samples: dict, window_s, rate_mbit: float, fabric: Fabric, title: str,
                    path: Path, faults: list[dict] | None = None,
                    t0_monotonic_s: float | None = None) -> Path:
    """Host uplink rates and CPU over the run, with the measured window shaded green and each
    fault's window red (``faults``: fault windows; ``t0_monotonic_s``: the monotonic time of
    the samples' zero)."""
    plt = pyplot()

    t = samples["t_s"]
    hosts = {h.name for h in fabric.hosts}
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for label, counts in samples["link_bytes"].items():
        if label.split("->")[0] not in hosts:
            continue
        rates = [0.0] + [(counts[i] - counts[i - 1]) * 8 / (t[i] - t[i - 1]) / 1e6
                         for i in range(1, len(t))]
        ax1.plot(t, rates, lw=0.8)
    ax1.axhline(rate_mbit, color="k", ls="--", lw=1, label="configured rate")
    ax1.set_ylabel("host uplink rate (Mbit/s)")
    legend_outside(ax1, fontsize=8)
    ax2.plot(t, [100 * x for x in samples["cpu_busy_fraction"]], label="machine CPU busy (%)")
    ax2.plot(t, [100 * x for x in samples["vswitchd_cores"]], label="ovs-vswitchd (% of a core)")
    ax2.set_ylabel("%")
    ax2.set_xlabel("time since start of sampling (s)")
    legend_outside(ax2, fontsize=8)
    for ax in (ax1, ax2):
        ax.axvspan(*window_s, color="tab:green", alpha=0.1)
    if faults and t0_monotonic_s is not None:
        shade_faults((ax1, ax2), fault_spans(faults, t0_monotonic_s, t[-1] if t else 0.0))
        legend_outside(ax1, fontsize=8)
    ax1.set_title(f"{title}\nhost uplink rates and CPU (shaded: measured window"
                  + (", red: faults" if faults else "") + ")", fontsize=9)
    return save(fig, path)


def plot_utilisation(util: dict[str, float], fabric: Fabric, title: str, path: Path) -> Path:
    """Utilisation of every link direction in the measured window: on the left each
    direction as a dot, grouped by the role of the node that sends on it; on the right the
    busiest directions by name."""
    plt = pyplot()
    roles = {n.name: n.role for n in fabric.nodes.values()}
    order = list(dict.fromkeys(n.role for n in fabric.nodes.values()))  # hosts first
    colours = {role: COLOUR_BLIND_SAFE[i % len(COLOUR_BLIND_SAFE)]
               for i, role in enumerate(order)}
    fig, (dots, bars) = plt.subplots(1, 2, figsize=(12, 4.5),
                                     gridspec_kw={"width_ratios": [1.2, 1]})
    for i, role in enumerate(order):
        values = sorted(100 * v for k, v in util.items() if roles[k.split("->")[0]] == role)
        if not values:
            continue
        xs = [i + (j / max(len(values) - 1, 1) - 0.5) * 0.6 for j in range(len(values))]
        dots.scatter(xs, values, s=10, color=colours[role])
    dots.set_xticks(range(len(order)), [f"from {role}" for role in order], fontsize=8)
    dots.axhline(100, color="black", lw=0.8, ls="--")
    dots.set_ylabel("utilisation in the measured window (% of the link rate)")
    dots.set_title("every link direction, by the sending node's role", fontsize=9)
    busiest = sorted(util, key=lambda k: -util[k])[:BUSIEST_BARS][::-1]
    bars.barh(range(len(busiest)), [100 * util[k] for k in busiest],
              color=[colours[roles[k.split("->")[0]]] for k in busiest])
    bars.set_yticks(range(len(busiest)), busiest, fontsize=7)
    bars.axvline(100, color="black", lw=0.8, ls="--")
    bars.set_xlabel("utilisation (% of the link rate)")
    bars.set_title(f"the {len(busiest)} busiest link directions", fontsize=9)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def plot_topology(fabric: Fabric, title: str, path: Path) -> Path:
    """The fabric a run measured on, drawn by tier with its node roles."""
    return draw(fabric, path, title=title)


def plot_weathermap(fabric: Fabric, utilisation: dict[str, float | None], title: str,
                    path: Path) -> Path:
    """The topology drawing with every link coloured by its measured utilisation (the
    busier of its two directions), from the switches' own counters."""
    return draw(fabric, path, utilisation=utilisation, title=title)


def plot_spread(series: list[tuple[str, dict]], title: str, path: Path) -> Path:
    """A repeated run's headline numbers, one panel each: every run's value as a dot (in run
    order, left to right) and the median as a line; ``series`` holds (label, spread) with
    spreads as testbed.harness.repeat.spread makes them."""
    plt = pyplot()
    columns = min(4, len(series))
    rows = -(-len(series) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False)
    for ax, (label, s) in zip(axes.flat, series):
        runs = [(i + 1, v) for i, v in enumerate(s["values"]) if v is not None]
        ax.plot([i for i, _ in runs], [v for _, v in runs], "o", color="0.2", ms=5)
        ax.axhline(s["median"], color="#0072B2", lw=1.2, label="median")
        ax.set_xticks(range(1, len(s["values"]) + 1))
        ax.set_xlabel("run", fontsize=7)
        ax.set_ylabel(s["unit"] or "value", fontsize=7)
        ax.set_title(textwrap_label(label), fontsize=7)
        ax.tick_params(labelsize=7)
        ax.margins(x=0.2, y=0.3)
    for ax in list(axes.flat)[len(series):]:
        ax.axis("off")
    fig.suptitle(f"{title}\nevery headline number in every run; line: the median", fontsize=8)
    return save(fig, path)


def textwrap_label(label: str, width: int = 40) -> str:
    """A panel title wrapped to lines of ``width`` characters, never cut."""
    import textwrap

    return "\n".join(textwrap.wrap(label, width)) or label
