"""Run folders for tests of the report, drawn by the harness's own plotting code from
made-up measurements of a k=4 fat-tree: the topology, a weathermap, link utilisation and
rates over time, with summary.json, report.md and report.html beside them as a run writes
them. Nothing here touches the machine."""
from __future__ import annotations

from pathlib import Path

from tests.unit.summaries import number, run_summary

from testbed.experiments.allreduce.experiment import AllReduce
from testbed.harness.plots import (
    plot_timeseries,
    plot_topology,
    plot_utilisation,
    plot_weathermap,
)
from testbed.harness.report import write_report
from testbed.harness.run import plot_records
from testbed.harness.summary_schema import write_summary
from testbed.measure.telemetry import link_directions
from testbed.model.topology.fattree import fat_tree
from testbed.model.verdict import at_least, holds

RATE_MBIT = 6.0
SAMPLES = 8


def figures(fabric, folder: Path, title: str) -> list[Path]:
    """The figures an allreduce run draws, from made-up measurements: every link direction
    busy in its own measure, a quarter of them not measured in the weathermap."""
    plots = folder / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    labels = [d.label for d in link_directions(fabric)]
    util = {label: (i % 7) / 6 for i, label in enumerate(labels)}
    partial = {label: (None if i % 4 == 0 else value)
               for i, (label, value) in enumerate(util.items())}
    t = [0.25 * i for i in range(SAMPLES)]
    per_step = int(0.25 * RATE_MBIT * 1e6 / 8 * 0.9)
    samples = {"t_s": t, "cpu_busy_fraction": [0.5] * SAMPLES,
               "vswitchd_cores": [0.8] * SAMPLES,
               "link_bytes": {label: [i * per_step for i in range(SAMPLES)] for label in labels}}
    return [plot_topology(fabric, title, plots / "topology.png"),
            plot_timeseries(samples, [0.5, 1.5], RATE_MBIT, fabric, title,
                            plots / "link_rates.png"),
            plot_utilisation(util, fabric, title, plots / "link_utilisation.png"),
            plot_weathermap(fabric, partial, title, plots / "weathermap.png")]


def synthetic_run(folder: Path) -> Path:
    """A finished allreduce run's folder on a k=4 fat-tree (made-up numbers); the folder."""
    fabric = fat_tree(4, host_rate_mbit=RATE_MBIT)
    folder.mkdir(parents=True, exist_ok=True)
    paths = figures(fabric, folder, f"{folder.name} | fattree k=4 | 6 Mbit/s links")
    summary = run_summary(
        run_id=folder.name, results_dir=str(folder),
        checks=[holds("data verified on every rank", True, measured=16, expected=16),
                at_least("busbw / link rate", 0.97, 0.9, "fraction", "busbw 5.8 Mbit/s")],
        rows=[("busbw", "5.82 Mbit/s = 97% of the 6 Mbit/s link rate",
               number("busbw", 5.82, "Mbit/s"), number("of the link rate", 0.97, "fraction")),
              ("AllReduce size", "2 MiB float32", number("AllReduce size", 2097152, "bytes"))],
        plots=plot_records(paths, folder, AllReduce.captions))
    summary["report"] = [p.name for p in write_report(summary, folder)]
    write_summary(folder, summary)
    return folder
