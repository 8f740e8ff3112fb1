"""The pipeline-parallel experiment: micro-batches in flight expected per schedule and counted
from the operations as they ran, a schedule's summary, the checks PASS and FAIL computed by
hand against (p-1)/(m+p-1), the Gantt charts, and both schedules run over loopback."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from pydantic import ValidationError

from tests.unit.loopback_fabric import measure_setups
from testbed.experiments.pipeline_parallel.experiment import (
    PipelineParams,
    expected_peak_in_flight,
    measured_peak_in_flight,
    schedule_summary,
)
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import ScenarioError
from testbed.traffic.training.pipeline import SCHEDULES, simulate_pipeline

SMALL = {"topology": {"name": "spineleaf", "leaves": 2, "spines": 1, "hosts_per_leaf": 2},
         "link_rate_mbit": 6}


def scenario(**params):
    return validate({"name": "p", "experiment": "pipeline-parallel", **SMALL, "params": params})


def test_in_flight_expected_per_schedule():
    assert expected_peak_in_flight("gpipe", 4, 8) == [8, 8, 8, 8]
    assert expected_peak_in_flight("1f1b", 4, 8) == [4, 3, 2, 1]
    assert expected_peak_in_flight("1f1b", 4, 2) == [2, 2, 2, 1]  # never more than m


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "micro_batches"), [(4, 8), (3, 5), (2, 1)])
def test_in_flight_counted_from_a_simulated_run(schedule, stages, micro_batches):
    records = [asdict(r) for r in simulate_pipeline(SCHEDULES[schedule](stages, micro_batches),
                                                     0.02, 0.04, 0.001)]
    assert measured_peak_in_flight(records, stages) == expected_peak_in_flight(
        schedule, stages, micro_batches)


def test_in_flight_counted_in_the_order_operations_started():
    # stage 0: F0 F1 B0 F2 B1 B2 by start time, listed out of order: at most 2 held
    ops = [("B", 2, 5.0), ("F", 0, 0.0), ("B", 0, 2.0), ("F", 1, 1.0), ("F", 2, 3.0),
           ("B", 1, 4.0)]
    records = [{"stage": 0, "kind": k, "micro_batch": m, "start_s": t, "end_s": t + 0.5}
               for k, m, t in ops]
    assert measured_peak_in_flight(records, 1) == [2]


def test_params_and_problems():
    assert PipelineParams().schedules == ["gpipe", "1f1b"]
    with pytest.raises(ValidationError, match="lists a schedule twice"):
        PipelineParams(schedules=["1f1b", "1f1b"])
    with pytest.raises(ScenarioError, match="stages: 5 stages need 5 hosts; the fabric has 4"):
        scenario(stages=5)


def test_a_schedules_summary_by_hand():
    records = [asdict(r) for r in simulate_pipeline(SCHEDULES["1f1b"](4, 8), 0.05, 0.1)]
    head = {"verified": True, "tcp_retrans_segs": 0, "bubble_measured": 0.28,
            "steps": [{"bubble": 0.27, "makespan_s": 1.7}, {"bubble": 0.29, "makespan_s": 1.8}],
            "makespan_predicted_s": 1.65, "records": records}
    s = schedule_summary("1f1b", [head, {"verified": False, "tcp_retrans_segs": 2}], 4, 8)
    assert s["bubble_theory"] == pytest.approx(3 / 11)
    assert s["peak_in_flight_measured"] == s["peak_in_flight_expected"] == [4, 3, 2, 1]
    assert (s["verified"], s["verified_ranks"], s["tcp_retransmits"]) == (False, 1, 2)
    assert s["makespan_s"] == [1.7, 1.8]


def summary(bubble: float, peaks: list[int], verified=True) -> dict:
    return {"bubble_measured": bubble, "bubble_theory": 3 / 11, "bubble_per_flush": [bubble],
            "makespan_s": [3.5], "makespan_predicted_s": 3.3, "peak_in_flight_measured": peaks,
            "peak_in_flight_expected": [4, 3, 2, 1], "verified": verified,
            "verified_ranks": 4 if verified else 3, "tcp_retransmits": 0}


def test_checks_pass_and_fail_by_hand():
    exp = scenario(micro_batches=8).experiment
    # theory 3/11 = 0.2727; 10% of it is 0.0273: 0.28 is within it, 0.35 is not
    good = exp.checks({"fabric": {"schedules": {"1f1b": summary(0.28, [4, 3, 2, 1])}}})
    assert [c.outcome for c in good] == ["PASS", "PASS", "PASS"]
    assert good[1].tolerance == pytest.approx(0.0273, abs=1e-4)
    bad = exp.checks({"fabric": {"schedules": {"1f1b": summary(0.35, [4, 4, 2, 1], False)}}})
    assert [c.outcome for c in bad] == ["FAIL", "FAIL", "FAIL"]


def test_rows_and_gantt_charts(tmp_path):
    exp = scenario(micro_batches=8).experiment
    records = [asdict(r) for r in simulate_pipeline(SCHEDULES["gpipe"](4, 8), 0.05, 0.1)]
    (tmp_path / "records-gpipe.json").write_text(json.dumps(records))
    r = {"fabric": {"schedules": {"gpipe": summary(0.28, [8, 8, 8, 8]),
                                  "1f1b": summary(0.28, [4, 3, 2, 1])}, "dir": str(tmp_path)}}
    assert exp.rows(r)[0][1].startswith("bubble 0.280 (theory 0.273; per flush 0.280)")
    [path] = exp.plots(r, tmp_path, "run | fattree | 6 Mbit/s")  # 1f1b has no records file
    assert path.name == "gantt-gpipe.png" and path.stat().st_size > 10_000


def test_the_bundled_scenario():
    resolved = load("pipeline-parallel")
    assert resolved.experiment.params.stages == 4
    assert resolved.experiment.params.micro_batches == 8


def test_both_schedules_over_loopback(tmp_path):
    resolved = scenario(micro_batches=4, forward_ms=10, backward_ms=20, steps=1)
    results = measure_setups(resolved, tmp_path)
    r = results["fabric"]
    assert r["hosts"] == ["l0h0", "l0h1", "l1h0", "l1h1"]
    assert r["schedules"]["gpipe"]["peak_in_flight_measured"] == [4, 4, 4, 4]
    assert r["schedules"]["1f1b"]["peak_in_flight_measured"] == [4, 3, 2, 1]
    assert (tmp_path / "fabric" / "records-1f1b.json").exists()
    outcomes = {c.name: c.outcome for c in resolved.experiment.checks(results)}
    assert outcomes["gpipe: data verified"] == outcomes["1f1b: data verified"] == "PASS"


def test_the_ranks_arguments():
    exp = scenario(micro_batches=6, activation_bytes=8192, forward_ms=30, backward_ms=60,
                   steps=3).experiment
    assert exp.rank_args("gpipe") == ["--schedule", "gpipe", "--micro-batches", "6",
                                      "--activation-bytes", "8192", "--forward-ms", "30.0",
                                      "--backward-ms", "60.0", "--steps", "3", "--seed", "1",
                                      "--channels", "1"]
