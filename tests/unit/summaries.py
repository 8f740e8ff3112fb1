"""summary.json files as runs write them (schema version 2, every key present), for tests of
what reads them: reports, comparisons, gates and repeats. Nothing here runs anything."""
from __future__ import annotations

import json
from pathlib import Path

from testbed.harness.summary_schema import SCHEMA_VERSION, validated
from testbed.model.verdict import Verdict, at_most

PROVENANCE = {"testbed_version": "0.2.0", "commit": "abc", "command_line": ["testbed", "run"],
              "kernel": "6.1.0", "uname": "Linux 6.1.0 #1 SMP x86_64", "ovs_version": "3.1.0",
              "mininet_version": "2.3.0", "python": "3.11.2",
              "python_packages": {"numpy": "2.4.6"}, "machine": "x86_64", "cpus": 2,
              "memory_bytes": 1 << 30, "paths": {"ovs_datapath": "userspace"}}
TRUSTED = (at_most("machine CPU busy", 0.4, 0.95, "fraction"),)
UNTRUSTED = (at_most("machine CPU busy", 0.99, 0.95, "fraction"),)


def number(name: str, value, unit: str) -> dict:
    return {"name": name, "value": value, "unit": unit}


def run_summary(run_id: str = "r1", checks=(), trust=TRUSTED, rows=(), status="complete",
                experiment: str = "allreduce", results_dir: str | None = None,
                plots=(), error: str | None = None) -> dict:
    """A whole, valid summary of one run; ``rows`` as (what, text, numbers...) tuples."""
    summary = {
        "schema_version": SCHEMA_VERSION, "kind": "run", "run_id": run_id,
        "experiment": experiment, "title": "ring AllReduce", "headline": "16 ranks",
        "status": status, "error": error, "started_at": "2026-12-01T00:00:00+00:00",
        "finished_at": "2026-12-01T00:01:00+00:00", "wall_s": 60.0, "provenance": PROVENANCE,
        "results_dir": results_dir or f"results/{run_id}", "scenario": {"name": "s"},
        "params": {}, "link_rate_mbit": 6.0, "link_rate_decided_by": "set by the scenario",
        "mtu_bytes": 9000, "ecn_path": None, "setups": {}, "results": {},
        "verdict": Verdict(list(checks), list(trust)).to_dict(),
        "rows": [{"what": what, "text": text, "numbers": list(numbers)}
                 for what, text, *numbers in rows],
        "plots": list(plots), "report": ["report.md", "report.html"]}
    return validated(summary)


def write_run(folder: Path, **kwargs) -> Path:
    """A run folder holding a summary made by ``run_summary(**kwargs)``; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    summary = run_summary(run_id=kwargs.pop("run_id", folder.name),
                          results_dir=str(folder), **kwargs)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return folder


def repeat_summary(runs: list[dict], asked: int | None = None, repeat_id: str = "rep",
                   folder: Path = Path("results/rep"), status: str = "complete") -> dict:
    """A whole, valid summary of a repeat of ``runs`` (run summaries), as the harness
    aggregates them."""
    from testbed.harness.repeat import aggregate

    summary = aggregate(runs, asked or len(runs), repeat_id, folder)
    summary.update(status=status, error=None, started_at="2026-12-01T00:00:00+00:00",
                   finished_at="2026-12-01T00:05:00+00:00", wall_s=300.0, plots=[],
                   report=None)
    return validated(summary)


def write_repeat(folder: Path, runs: list[dict], **kwargs) -> Path:
    """A repeat's folder holding its summary; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    summary = repeat_summary(runs, repeat_id=folder.name, folder=folder, **kwargs)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return folder
