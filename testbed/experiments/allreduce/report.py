"""Turn a run's summary into what people read: a printed table, JSON files and PNG plots."""
from __future__ import annotations

import json
from pathlib import Path

from testbed.apply.controller import PORT_STATS_FILE
from testbed.model.topology.base import Fabric

OPENFLOW_PLOT_LINKS = 12  # link directions drawn in the OpenFlow utilisation plot


def write_results(summary: dict, workdir: Path, fabric: Fabric) -> list[Path]:
    """Write summary.json (samples split out into samples.json) and the plots; returns plots."""
    workload = summary.get("workload", {})
    samples = workload.pop("samples", None)
    if samples is not None:
        (workdir / "samples.json").write_text(json.dumps(samples))
    ecn = summary.get("ecn") or {}
    queue_samples = ecn.pop("samples", None)
    if queue_samples is not None:
        (workdir / "queue_depth.json").write_text(json.dumps(queue_samples))
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    plots = []
    if samples is not None:
        plots.append(plot_timeseries(samples, workload, fabric, workdir / "link_rates.png"))
        plots.append(plot_utilisation(workload, fabric, workdir / "link_utilisation.png"))
    if queue_samples is not None and queue_samples["t_s"]:
        plots.append(plot_queue_depth(queue_samples, ecn, workdir / "queue_depth.png"))
    openflow = plot_openflow_utilisation(fabric, workdir / PORT_STATS_FILE,
                                         workload.get("timed_window_monotonic_s"),
                                         workdir / "openflow_link_utilisation.png")
    if openflow is not None:
        plots.append(openflow)
    return plots


def plot_openflow_utilisation(fabric: Fabric, port_stats_path: Path, window_monotonic_s,
                              path: Path, most: int = OPENFLOW_PLOT_LINKS) -> Path | None:
    """Utilisation over time of the busiest link directions, from the switches' own port
    counters as the controller polled them over OpenFlow (port-stats.jsonl); None when the
    run polled nothing."""
    from testbed.measure.openflow import link_rate_series
    from testbed.model.port_stats import port_samples, read_json_lines

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
    ax.set_title(f"the {len(busiest)} busiest link directions, from OpenFlow port counters "
                 "(shaded: timed iterations)")
    ax.legend(loc="upper right", fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def busiest_ports(queue_samples: dict, most: int) -> list[str]:
    """The ``most`` ports with the largest mean sampled queue, busiest first; idle ones left out."""
    means = {intf: sum(d) / len(d) for intf, d in queue_samples["depth_bytes"].items() if any(d)}
    return sorted(means, key=lambda intf: -means[intf])[:most]


def plot_queue_depth(queue_samples: dict, ecn: dict, path: Path, most: int = 8) -> Path:
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
    ax.set_title(f"switch egress queues ({ecn['path']}), sampled every {ecn['sample_ms']:g} ms")
    ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeseries(samples: dict, workload: dict, fabric: Fabric, path: Path) -> Path:
    """Host uplink rates and CPU over the run, with the timed window shaded."""
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
    ax1.axhline(workload["link_rate_mbit"], color="k", ls="--", lw=1, label="configured rate")
    ax1.set_ylabel("host uplink rate (Mbit/s)")
    ax1.legend(loc="upper right")
    ax2.plot(t, [100 * x for x in samples["cpu_busy_fraction"]], label="machine CPU busy (%)")
    ax2.plot(t, [100 * x for x in samples["vswitchd_cores"]], label="ovs-vswitchd (% of a core)")
    ax2.set_ylabel("%")
    ax2.set_xlabel("time since start of sampling (s)")
    ax2.legend(loc="upper right")
    for ax in (ax1, ax2):
        ax.axvspan(*workload["timed_window_s"], color="tab:green", alpha=0.1)
    ax1.set_title(f"ring AllReduce, {workload['world']} ranks: busbw "
                  f"{workload['busbw_mbit_s']:.2f} Mbit/s (shaded: timed iterations)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_utilisation(workload: dict, fabric: Fabric, path: Path) -> Path:
    """Utilisation of every link direction during the timed window, grouped by tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles = {n.name: n.role for n in fabric.nodes.values()}
    util = workload["link_utilisation"]
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
    ax.set_title("link utilisation, by the sending node's role")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colors[r]) for r in order],
              labels=order, loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_summary(summary: dict) -> str:
    """The table a run prints at the end."""
    w = summary["workload"]
    f = w["fidelity"]
    e = w["ecmp"]
    rows = [
        ("data verified", f"{'yes' if w['verified'] else 'NO'} ({w['verified_ranks']}/{w['world']} ranks)"),
        ("AllReduce size", f"{w['size_bytes'] / 2**20:g} MiB float32"),
        ("time per iteration", f"{w['time_s']:.3f} s (iterations: "
                               f"{', '.join(f'{x:.2f}' for x in w['iteration_s'])})"),
        ("algbw", f"{w['algbw_gbyte_s'] * 8e3:.2f} Mbit/s"),
        ("busbw", f"{w['busbw_mbit_s']:.2f} Mbit/s = {w['busbw_fraction_of_link']:.0%} of "
                  f"the {w['link_rate_mbit']:g} Mbit/s link rate"),
        ("link utilisation", f"max {max(w['link_utilisation'].values()):.0%}, "
                             f"mean over used links {_mean_used(w['link_utilisation']):.0%}"),
        ("ECMP spread", f"{'yes' if e['spread'] else 'no'}: {e['uplinks_used']}/"
                        f"{e['uplinks_in_groups']} group uplinks carried traffic, "
                        f"mean Jain index {e['jain_mean']}"),
        ("fidelity", f"{'TRUSTWORTHY' if f['trustworthy'] else 'NOT TRUSTWORTHY'}: "
                     f"{'; '.join(f['reasons'])}"),
        *(("note", note) for note in f.get("notes", [])),
        *anycast_rows(summary),
        *ecn_rows(summary),
        ("results", summary["results_dir"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _mean_used(util: dict) -> float:
    used = [v for v in util.values() if v > 0.01]
    return sum(used) / len(used) if used else 0.0


def anycast_rows(summary: dict) -> list[tuple[str, str]]:
    """A summary row for an anycast failover (testbed.experiments.anycast.run), where one ran."""
    failover = (summary.get("anycast") or {}).get("failover")
    if not failover:
        return []
    return [("anycast failover",
             f"{failover['client']} served by {failover['far']} "
             f"{failover['to_far_s'] * 1000:.0f} ms after {failover['near']}'s link "
             f"{failover['interface']} went down ({failover['requests_lost']} requests lost), "
             f"back on {failover['near']} {failover['back_to_near_s'] * 1000:.0f} ms after "
             f"it returned")]


def ecn_rows(summary: dict) -> list[tuple[str, str]]:
    """Summary rows for the hosts' TCP and the switch queues' ECN marking, where configured."""
    rows = []
    tcp = summary.get("host_tcp")
    if tcp and (tcp["congestion_control"] or tcp["ecn"]):
        cc = tcp["congestion_control"] or "kernel default"
        ecn_state = "on" if tcp["ecn"] else "off"
        rows.append(("host TCP", f"{cc}, ECN {ecn_state} ({tcp['decided_by']})"))
    ecn = summary.get("ecn")
    if ecn:
        totals, queue = ecn["totals"], ecn["queue"]
        ect = "" if totals["ect_packets"] is None else f" of {totals['ect_packets']} ECT packets"
        peak = ("" if totals["max_queue_bytes"] is None
                else f"; peak queue {totals['max_queue_bytes']} B")
        rows.append(("ECN marking", f"{ecn['path']}, {queue['ecn'] or 'no profile'}, buffer "
                                    f"{queue['buffer_bytes']} B: {totals['marks']} CE marks"
                                    f"{ect} on {totals['ports_marking']} ports{peak}; "
                                    f"{totals['fifo_drops']} FIFO drops"))
    return rows
