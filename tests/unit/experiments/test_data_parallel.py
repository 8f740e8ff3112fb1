"""The data-parallel experiment: parameters, the ranks' arguments, a run's summary and the
checks PASS and FAIL computed by hand, rows and the figure, the bundled scenario, and two
short runs measured for real over loopback."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.unit.loopback_fabric import measure_setups
from testbed.experiments.data_parallel.experiment import (
    DataParallelParams,
    relative_error,
    run_summary,
)
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import ScenarioError
from testbed.plan.training import cost_links

SMALL = {"topology": {"name": "spineleaf", "leaves": 2, "spines": 1, "hosts_per_leaf": 2},
         "link_rate_mbit": 6}


def scenario(**params):
    return validate({"name": "d", "experiment": "data-parallel", **SMALL, "params": params})


def test_params():
    p = DataParallelParams()
    assert p.models == ["resnet50", "gpt2_small"] and p.workers == [2, 4, 8, 16]
    assert DataParallelParams(workers=[8, 2]).workers == [2, 8]  # in order
    with pytest.raises(ValidationError, match="at least 2"):
        DataParallelParams(workers=[1, 2])
    with pytest.raises(ValidationError, match="lists a count twice"):
        DataParallelParams(workers=[2, 2])
    with pytest.raises(ValidationError, match="lists a model twice"):
        DataParallelParams(models=["resnet50", "resnet50"])
    with pytest.raises(ValidationError):
        DataParallelParams(models=["vgg16"])


def test_more_workers_than_hosts_is_a_problem():
    with pytest.raises(ScenarioError, match="workers: 8 workers need 8 hosts; the fabric has 4"):
        scenario(workers=[2, 8])


def test_the_ranks_arguments_per_model():
    exp = scenario(workers=[2, 4], images_per_step=16, tokens_per_step=512, scale=0.001).experiment
    fabric = exp.fabric()
    cost = cost_links(fabric, [h.name for h in fabric.hosts])
    resnet = exp.rank_args("resnet50", cost)
    assert resnet[:12] == ["--model", "resnet50", "--scale", "0.001", "--steps", "3",
                           "--warmup-steps", "1", "--device-gflops", "1000.0", "--samples", "16"]
    assert resnet[12:14] == ["--split", "flops"]
    assert exp.rank_args("gpt2_small", cost)[11] == "512"
    assert "--link-rate-mbit" in resnet


def rank(verified=True) -> dict:
    return {"verified": verified, "tcp_retrans_segs": 1}


def test_a_runs_summary_by_hand():
    head = {**rank(), "job_mean_step_s": 2.0, "job_step_s": [1.9, 2.1], "mean_step_s": 1.8,
            "forward_s": 0.25, "backward_s": 0.5, "mean_comm_s": 1.5,
            "mean_exposed_comm_s": 1.25, "exposed_share": 0.625,
            "predicted": {"step_s": 1.5, "exposed_share": 0.5},
            "buckets": [{"message_bytes": 100}, {"message_bytes": 50}],
            "timed_window_monotonic_s": [1.0, 9.0]}
    s = run_summary("resnet50", ["a", "b", "c"], [head, rank(), rank(False)], {"link": {}})
    assert (s["workers"], s["buckets"], s["message_bytes"]) == (3, 2, 150)
    assert s["step_s"] == 2.0 and s["compute_s"] == 0.75
    assert s["comm_share"] == 0.75  # 1.5 of 2.0 s
    assert s["scaling_efficiency"] == 0.375  # compute alone 0.75 s over the 2.0 s step
    assert s["predicted_scaling_efficiency"] == 0.5
    assert (s["verified"], s["verified_ranks"], s["tcp_retransmits"]) == (False, 2, 3)
    assert relative_error(1.2, 1.0) == pytest.approx(0.2) and relative_error(1.0, 0) is None


def run(model: str, workers: int, efficiency: float, step_s: float, predicted_s: float,
        verified=True) -> dict:
    return {"model": model, "workers": workers, "verified": verified,
            "verified_ranks": workers if verified else 0, "scaling_efficiency": efficiency,
            "step_s": step_s, "predicted_step_s": predicted_s, "compute_s": 0.5,
            "comm_s": 0.5, "comm_share": 0.5, "exposed_share": 0.2,
            "predicted_scaling_efficiency": 0.5, "buckets": 5, "message_bytes": 1000}


def outcomes(exp, runs) -> dict:
    return {c.name: c.outcome for c in exp.checks({"fabric": {"runs": runs}})}


def test_checks_pass_by_hand():
    exp = scenario(models=["resnet50"], workers=[2, 4]).experiment
    # efficiency 90% -> 60%: falls; worst step 1.0 s against 0.8 s predicted: 25% <= 50%
    assert outcomes(exp, [run("resnet50", 2, 0.9, 0.6, 0.55), run("resnet50", 4, 0.6, 1.0, 0.8)]
                    ) == {"data verified on every rank": "PASS",
                          "resnet50: scaling efficiency falls with workers": "PASS",
                          "resnet50: step time vs prediction": "PASS"}


def test_checks_fail_by_hand():
    exp = scenario(models=["resnet50"], workers=[2, 4]).experiment
    # efficiency 60% -> 90% rises beyond the 3% of noise; 2.0 s against 1.0 s: 100% off
    assert set(outcomes(exp, [run("resnet50", 2, 0.6, 2.0, 1.0, verified=False),
                              run("resnet50", 4, 0.9, 1.0, 1.0)]).values()) == {"FAIL"}


def test_rows_and_the_figure(tmp_path):
    exp = scenario(models=["resnet50"], workers=[2, 4]).experiment
    runs = [run("resnet50", 2, 0.9, 0.6, 0.55), run("resnet50", 4, 0.6, 1.0, 0.8)]
    rows = exp.rows({"fabric": {"runs": runs}})
    assert rows[0][0] == "resnet50, 2 workers"
    assert rows[1][1].startswith("step 1.000 s (predicted 0.800 s)")
    [path] = exp.plots({"fabric": {"runs": runs}}, tmp_path, "run | fattree | 6 Mbit/s")
    assert path.name == "scaling.png" and path.stat().st_size > 10_000


def test_the_bundled_scenario():
    resolved = load("data-parallel")
    assert resolved.experiment.params.workers == [2, 4, 8, 16]
    assert len(resolved.setups[0].fabric.hosts) == 16


def test_two_short_runs_over_loopback(tmp_path):
    resolved = validate({"name": "d", "experiment": "data-parallel", **SMALL, "params": {
        "models": ["resnet50"], "workers": [2, 4], "scale": 0.0002, "steps": 1,
        "device_gflops": 100000}})
    results = measure_setups(resolved, tmp_path)
    runs = results["fabric"]["runs"]
    assert [(r["model"], r["workers"]) for r in runs] == [("resnet50", 2), ("resnet50", 4)]
    assert all(r["verified"] and r["buckets"] == 5 for r in runs)
    assert runs[1]["hosts"] == ["l0h0", "l0h1", "l1h0", "l1h1"]
    assert runs[0]["cost_model"]["link"]["hops"] == 2  # both on one leaf
    checks = {c.name: c.outcome for c in resolved.experiment.checks(results)}
    assert checks["data verified on every rank"] == "PASS"
