"""Figures every experiment can draw from what the harness measures: link rates and CPU over
time, per-link utilisation, the switches' own port counters over OpenFlow, and queue depths.
Each takes the title prefix the harness gives (run, topology, rate) and writes one PNG."""
from __future__ import annotations

from pathlib import Path

from testbed.model.topology.base import Fabric

OPENFLOW_PLOT_LINKS = 12  # link directions drawn in the OpenFlow utilisation plot


def plot_openflow_utilisation(fabric: Fabric, port_stats_path: Path, window_monotonic_s,
                              title: str, path: Path,
                              most: int = OPENFLOW_PLOT_LINKS) -> Path | None:
    """Utilisation over time of the busiest link directions, from the switches' own port
    counters as the controller polled them over OpenFlow (port-stats.jsonl); None when the
    run polled nothing."""
    from testbed.measure.openflow import link_rate_series
    from testbed.model.records import port_samples, read_json_lines

    series = link_rate_series(fabric, port_samples(read_json_lines(port_stats_path)))
    series = {label: points for label, points in series.items() if points}
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate = {}
    for link in fabric.links:
        rate[f"{link.a}->{link.b}"] = rate[f"{link.b}->{link.a}"] = link.rate_mbit
    t0 = min(points[0].t0_s for points in series.values())
    busiest = sorted(series, key=lambda k: -max(p.mbit for p in series[k]))[:most]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label in busiest:
        points = series[label]
        scale = 100 / rate[label] if rate.get(label) else 0.0
        ax.step([p.t1_s - t0 for p in points], [p.mbit * scale for p in points], where="pre",
                lw=0.9, label=label)
    if window_monotonic_s:
        ax.axvspan(window_monotonic_s[0] - t0, window_monotonic_s[1] - t0, color="tab:green",
                   alpha=0.1)
    ax.set_xlabel("time since the first poll (s)")
    ax.set_ylabel("utilisation (%)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}\nthe {len(busiest)} busiest link directions, from OpenFlow port "
                 "counters (shaded: measured window)", fontsize=9)
    ax.legend(loc="upper right", fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def busiest_ports(queue_samples: dict, most: int) -> list[str]:
    """The ``most`` ports with the largest mean sampled queue, busiest first; idle ones left out."""
    means = {intf: sum(d) / len(d) for intf, d in queue_samples["depth_bytes"].items() if any(d)}
    return sorted(means, key=lambda intf: -means[intf])[:most]


def plot_queue_depth(queue_samples: dict, ecn: dict, title: str, path: Path,
                     most: int = 8) -> Path:
    """Queue depth over time of the busiest switch ports, with where marking starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = queue_samples["t_s"]
    fig, ax = plt.subplots(figsize=(9, 4))
    for intf in busiest_ports(queue_samples, most):
        ax.plot(t, [d / 1000 for d in queue_samples["depth_bytes"][intf]], lw=0.8, label=intf)
    if ecn["marking_starts_bytes"] is not None:
        ax.axhline(ecn["marking_starts_bytes"] / 1000, color="k", ls="--", lw=1,
                   label="marking starts")
    ax.axhline(ecn["queue"]["buffer_bytes"] / 1000, color="tab:red", ls=":", lw=1,
               label="buffer")
    ax.set_xlabel("time since start of sampling (s)")
    ax.set_ylabel("queue (KB)")
    ax.set_title(f"{title}\nswitch egress queues ({ecn['path']}), sampled every "
                 f"{ecn['sample_ms']:g} ms", fontsize=9)
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeseries(samples: dict, window_s, rate_mbit: float, fabric: Fabric, title: str,
                    path: Path) -> Path:
    """Host uplink rates and CPU over the run, with the measured window shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax1.legend(loc="upper right")
    ax2.plot(t, [100 * x for x in samples["cpu_busy_fraction"]], label="machine CPU busy (%)")
    ax2.plot(t, [100 * x for x in samples["vswitchd_cores"]], label="ovs-vswitchd (% of a core)")
    ax2.set_ylabel("%")
    ax2.set_xlabel("time since start of sampling (s)")
    ax2.legend(loc="upper right")
    for ax in (ax1, ax2):
        ax.axvspan(*window_s, color="tab:green", alpha=0.1)
    ax1.set_title(f"{title}\nhost uplink rates and CPU (shaded: measured window)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_utilisation(util: dict[str, float], fabric: Fabric, title: str, path: Path) -> Path:
    """Utilisation of every link direction during the timed window, grouped by tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles = {n.name: n.role for n in fabric.nodes.values()}
    order = list(dict.fromkeys(n.role for n in fabric.nodes.values()))  # hosts first
    labels = sorted(util, key=lambda k: (order.index(roles[k.split("->")[0]]), k))
    palette = plt.get_cmap("tab10")
    colors = {role: palette(i % 10) for i, role in enumerate(order)}
    fig, ax = plt.subplots(figsize=(max(9, len(labels) * 0.12), 4.5))
    ax.bar(range(len(labels)), [100 * util[k] for k in labels],
           color=[colors[roles[k.split("->")[0]]] for k in labels])
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=90, fontsize=5)
    ax.set_ylabel("utilisation in timed window (%)")
    ax.set_title(f"{title}\nlink utilisation in the measured window, by the sending node's "
                 "role", fontsize=9)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colors[r]) for r in order],
              labels=order, loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
