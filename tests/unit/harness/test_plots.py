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
