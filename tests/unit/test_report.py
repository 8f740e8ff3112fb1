"""What a run leaves for people: the printed table, the JSON files and the plots."""
from __future__ import annotations

import copy
import json

import pytest

from testbed.experiments.allreduce.report import format_summary, write_results
from testbed.measure.telemetry import link_directions
from testbed.model.topology.fattree import fat_tree

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_summary(results_dir: str = "results/run-1", verified: bool = True,
                 trustworthy: bool = True) -> dict:
    """A summary shaped like testbed.experiments.allreduce.run.allreduce_summary's, for a 16-rank ring."""
    reasons = (["CPU 40% busy, busiest link at 93% of its rate"] if trustworthy
               else ["machine CPU 99% busy (limit 95%)", "the emulator lost packets"])
    return {
        "run_id": "run-1",
        "results_dir": results_dir,
        "workload": {
            "kind": "allreduce", "world": 16, "size_bytes": 2 * 1024 * 1024,
            "verified": verified, "verified_ranks": 16 if verified else 15,
            "iteration_s": [6.1, 6.25, 6.05], "time_s": 6.1333,
            "algbw_gbyte_s": 0.000342, "busbw_gbyte_s": 0.000641,
            "busbw_mbit_s": 5.13, "busbw_fraction_of_link": 0.86, "link_rate_mbit": 6.0,
            "link_utilisation": {"p0e0h0->p0e0": 0.93, "p0e0->p0a0": 0.45, "c0->p1a0": 0.0,
                                 "p0a0->c0": 0.005},
            "ecmp": {"switches": {}, "jain_mean": 0.97, "uplinks_used": 30,
                     "uplinks_in_groups": 32, "spread": True},
            "fidelity": {"trustworthy": trustworthy, "reasons": reasons},
        },
    }


def rows(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, value = line.strip().split("  ", 1)
        out[key] = value.strip()
    return out


def test_format_summary_rows():
    table = rows(format_summary(make_summary()))
    assert table == {
        "data verified": "yes (16/16 ranks)",
        "AllReduce size": "2 MiB float32",
        "time per iteration": "6.133 s (iterations: 6.10, 6.25, 6.05)",
        "algbw": f"{0.000342 * 8e3:.2f} Mbit/s",
        "busbw": "5.13 Mbit/s = 86% of the 6 Mbit/s link rate",
        "link utilisation": f"max 93%, mean over used links {(0.93 + 0.45) / 2:.0%}",
        "ECMP spread": "yes: 30/32 group uplinks carried traffic, mean Jain index 0.97",
        "fidelity": "TRUSTWORTHY: CPU 40% busy, busiest link at 93% of its rate",
        "results": "results/run-1",
    }


def test_format_summary_failures_are_loud():
    table = rows(format_summary(make_summary(verified=False, trustworthy=False)))
    assert table["data verified"] == "NO (15/16 ranks)"
    assert table["fidelity"] == ("NOT TRUSTWORTHY: machine CPU 99% busy (limit 95%); "
                                 "the emulator lost packets")


def test_format_summary_aligns_values():
    lines = format_summary(make_summary()).splitlines()
    assert len(lines) == 9
    width = len("time per iteration")  # the longest label
    for line in lines:
        assert line.startswith("  ")
        assert line[2 + width:2 + width + 2] == "  "
        assert line[2 + width + 2] != " "


def test_format_summary_does_not_modify_the_summary():
    summary = make_summary()
    before = copy.deepcopy(summary)
    format_summary(summary)
    assert summary == before


# --- files -------------------------------------------------------------------------------------


@pytest.fixture
def fabric():
    return fat_tree(2, host_rate_mbit=6.0)


def make_samples(fabric) -> dict:
    t_s = [0.0, 0.25, 0.5, 0.75, 1.0]
    link_bytes = {d.label: [i * 150_000 if d.src.startswith("p0e0h") else 0
                            for i in range(len(t_s))]
                  for d in link_directions(fabric)}
    return {"t_s": t_s, "cpu_busy_fraction": [0.0, 0.5, 0.6, 0.7, 0.2],
            "vswitchd_cores": [0.0, 0.9, 1.0, 1.0, 0.8], "link_bytes": link_bytes}


def full_summary(fabric, results_dir) -> dict:
    summary = make_summary(str(results_dir))
    workload = summary["workload"]
    workload["world"] = len(fabric.hosts)
    workload["link_utilisation"] = {d.label: (0.8 if d.src.startswith("p0e0h") else 0.1)
                                    for d in link_directions(fabric)}
    workload["timed_window_s"] = [0.25, 0.75]
    workload["samples"] = make_samples(fabric)
    return summary


def test_write_results_files(tmp_path, fabric):
    summary = full_summary(fabric, tmp_path)
    samples = copy.deepcopy(summary["workload"]["samples"])
    plots = write_results(summary, tmp_path, fabric)

    assert plots == [tmp_path / "link_rates.png", tmp_path / "link_utilisation.png"]
    for plot in plots:
        data = plot.read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 1000
    assert json.loads((tmp_path / "samples.json").read_text()) == samples
    written = json.loads((tmp_path / "summary.json").read_text())
    assert "samples" not in written["workload"]
    assert written["workload"]["link_utilisation"] == summary["workload"]["link_utilisation"]
    assert written == summary  # the samples were split out of the caller's summary too
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "link_rates.png", "link_utilisation.png", "samples.json", "summary.json"]


def test_write_results_without_samples_writes_only_the_summary(tmp_path, fabric):
    summary = make_summary(str(tmp_path))
    assert write_results(summary, tmp_path, fabric) == []
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
