"""The figures every experiment can draw (testbed.harness.plots), from data shaped like a run's."""
from __future__ import annotations

import json

from testbed.harness.plots import plot_openflow_utilisation, plot_timeseries, plot_utilisation
from testbed.measure.telemetry import link_directions
from testbed.model.topology.fattree import fat_tree

RATE_MBIT = 6.0
TITLE = "r1 | fattree k=4 | 6 Mbit/s links"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_polls(path, fabric, polls: int = 4, interval_s: float = 0.5) -> None:
    lines = []
    for i in range(polls):
        for switch, port, _, link in fabric.switch_ends():
            nbytes = int(i * interval_s * RATE_MBIT * 1e6 / 8 * 0.5)  # 50% busy both ways
            lines.append({"t_monotonic_s": 100.0 + i * interval_s, "switch": switch,
                          "port": port, "tx_bytes": nbytes, "rx_bytes": nbytes,
                          "tx_packets": i, "rx_packets": i, "tx_dropped": 0})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_plot_is_drawn_from_port_counters(tmp_path):
    fabric = fat_tree(4, host_rate_mbit=RATE_MBIT)
    stats = tmp_path / "port-stats.jsonl"
    write_polls(stats, fabric)
    out = plot_openflow_utilisation(fabric, stats, [100.5, 101.5], TITLE,
                                    tmp_path / "of.png")
    assert out == tmp_path / "of.png" and out.stat().st_size > 10_000


def test_no_polls_no_plot(tmp_path):
    fabric = fat_tree(4, host_rate_mbit=RATE_MBIT)
    assert plot_openflow_utilisation(fabric, tmp_path / "missing.jsonl", None, TITLE,
                                     tmp_path / "of.png") is None
    assert not (tmp_path / "of.png").exists()


def test_rates_over_time_and_utilisation_by_tier(tmp_path):
    fabric = fat_tree(4, host_rate_mbit=RATE_MBIT)
    labels = [d.label for d in link_directions(fabric)]
    t = [0.0, 0.25, 0.5, 0.75]
    per_step = int(0.25 * RATE_MBIT * 1e6 / 8)
    samples = {"t_s": t, "cpu_busy_fraction": [0.5] * 4, "vswitchd_cores": [0.9] * 4,
               "link_bytes": {label: [i * per_step for i in range(4)] for label in labels}}
    path = plot_timeseries(samples, [0.25, 0.75], RATE_MBIT, fabric, TITLE, tmp_path / "r.png")
    assert path.read_bytes().startswith(PNG_MAGIC)
    util = {label: 0.5 for label in labels}
    path = plot_utilisation(util, fabric, TITLE, tmp_path / "u.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_a_few_series_get_clearly_different_hues():
    from testbed.harness.plots import distinct_colours

    colours = distinct_colours(12)
    assert len(set(colours[:10])) == 10 and colours[10] == colours[0]


# --- fault windows (the failure schedule's), shaded on the timelines ---------------------------


def test_fault_windows_become_spans_since_the_plots_zero():
    from testbed.harness.plots import fault_spans

    windows = [{"fault": "link_down a-b", "start_monotonic_s": 101.0, "end_monotonic_s": 103.5},
               {"fault": "controller_restart", "start_monotonic_s": 102.0,
                "end_monotonic_s": 102.0},
               {"fault": "switch_down s1", "start_monotonic_s": 104.0, "end_monotonic_s": None}]
    assert fault_spans(windows, 100.0, 9.0) == [(1.0, 3.5, "link_down a-b"),
                                                (2.0, 2.0, "controller_restart"),
                                                (4.0, 9.0, "switch_down s1")]


def drawn(monkeypatch) -> list:
    """The figures the plots save, kept for inspection."""
    import testbed.harness.plots as plots

    figures, save = [], plots.save

    def keep(fig, path):
        figures.append(fig)
        return save(fig, path)
    monkeypatch.setattr(plots, "save", keep)
    return figures


def red_spans(ax) -> list[tuple[float, float]]:
    from matplotlib.colors import to_rgb

    return sorted((round(p.get_x(), 3), round(p.get_x() + p.get_width(), 3)) for p in ax.patches
                  if to_rgb(p.get_facecolor()) == to_rgb("tab:red"))


def test_each_fault_is_shaded_red_on_the_switches_counters_and_on_the_host_rates(
        tmp_path, monkeypatch):
    figures = drawn(monkeypatch)
    fabric = fat_tree(4, host_rate_mbit=RATE_MBIT)
    stats = tmp_path / "port-stats.jsonl"
    write_polls(stats, fabric)
    windows = [{"fault": "link_down p0e0-p0a0", "start_monotonic_s": 100.6,
                "end_monotonic_s": 101.1}]
    plot_openflow_utilisation(fabric, stats, [100.5, 101.5], TITLE, tmp_path / "of.png",
                              faults=windows)
    # the plot's zero is the first poll's interval start (100.0)
    assert red_spans(figures[-1].axes[0]) == [(0.6, 1.1)]
    samples = {"t_s": [0.0, 0.5, 1.0, 1.5], "cpu_busy_fraction": [0.1] * 4,
               "vswitchd_cores": [0.2] * 4,
               "link_bytes": {d.label: [0, 1000, 2000, 3000] for d in link_directions(fabric)}}
    plot_timeseries(samples, (0.5, 1.5), RATE_MBIT, fabric, TITLE, tmp_path / "ts.png",
                    faults=windows, t0_monotonic_s=100.0)
    assert [red_spans(ax) for ax in figures[-1].axes[:2]] == [[(0.6, 1.1)], [(0.6, 1.1)]]
