"""The OpenFlow utilisation plot, drawn from a port-stats file like the controller writes."""
from __future__ import annotations

import json

from testbed.experiments.allreduce.report import plot_openflow_utilisation
from testbed.model.topology.fattree import fat_tree

RATE_MBIT = 6.0


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
    out = plot_openflow_utilisation(fabric, stats, [100.5, 101.5], tmp_path / "of.png")
    assert out == tmp_path / "of.png" and out.stat().st_size > 10_000


def test_no_polls_no_plot(tmp_path):
    fabric = fat_tree(4, host_rate_mbit=RATE_MBIT)
    assert plot_openflow_utilisation(fabric, tmp_path / "missing.jsonl", None,
                                     tmp_path / "of.png") is None
    assert not (tmp_path / "of.png").exists()
