"""The training-traffic scenarios on the wire, each shortened onto a small fabric so it runs
in well under a minute: a spine-leaf of 2 leaves and one spine at 6 Mbit/s (2 hosts per
leaf; 3 for the parameter server; 2 NVSwitch-like nodes of 2 GPUs for tensor parallelism).
Each test runs its bundled scenario through the harness (testbed.harness.run.run_scenario)
and asserts that the data verified on every rank, that the metrics the experiment reports
are there and plausible, and that the emulator (and the generators' own CPU) kept up; the
checks that decide the experiment's claim are asserted where the shortened run still makes
the claim, the others printed. Needs root; runs alone."""
from __future__ import annotations

import pytest

from testbed.harness.run import run_scenario
from testbed.experiments.registry import load

RATE_MBIT = 6
SPINE_LEAF = {"name": "spineleaf", "leaves": 2, "spines": 1, "hosts_per_leaf": 2}


def run(name: str, tmp_path, topology: dict | None = SPINE_LEAF, **params):
    overrides = {"results_dir": str(tmp_path), "link_rate_mbit": RATE_MBIT,
                 **{f"params.{k}": v for k, v in params.items()}}
    if topology is not None:
        overrides["topology"] = topology
    outcome = run_scenario(load(name, overrides), log=print)
    for check in outcome.verdict.checks + outcome.verdict.trust:
        print(f"{check.outcome} {check.setup or ''} {check.name}: {check.measured} "
              f"({check.expected}) {check.statement}")
    for row in outcome.summary["rows"]:
        print(f"{row['what']}: {row['text']}")
    assert outcome.status == "complete"
    assert outcome.verdict.emulator_trusted, outcome.verdict.reasons
    for setup, result in outcome.summary["results"].items():
        assert result["fidelity"]["generators"]["processes"] > 0, setup  # the ranks were seen
    assert (outcome.workdir / "report.md").exists()
    return outcome


def outcomes(outcome) -> dict[str, str]:
    return {check.name: check.outcome for check in outcome.verdict.checks}


def test_collectives_sweep(tmp_path):
    outcome = run("collectives-sweep", tmp_path, sweeps=["allreduce:ring", "alltoall"],
                  max_bytes=65536, busbw_claim_bytes=1048576, iters=1)
    result = outcome.summary["results"]["fabric"]
    ring = result["sweeps"]["allreduce-ring"]
    assert ring["rows"][-1]["size_bytes"] == 1048576 and ring["verified_ranks"] == 4
    assert result["cost_model"]["source"].startswith("derived from the fabric")
    checks = outcomes(outcome)
    assert checks["allreduce-ring: #wrong"] == checks["alltoall-pairwise: #wrong"] == "PASS"
    assert checks["ring AllReduce busbw / link rate at 1048576 B"] == "PASS"
    assert (outcome.workdir / "nccl-tests-allreduce-ring.txt").exists()
    assert (outcome.workdir / "plots" / "busbw.png").exists()


def test_data_parallel(tmp_path):
    outcome = run("data-parallel", tmp_path, models=["resnet50"], workers=[2, 4], steps=2)
    runs = outcome.summary["results"]["fabric"]["runs"]
    assert [r["workers"] for r in runs] == [2, 4]
    for r in runs:
        assert r["verified"] and r["step_s"] >= r["compute_s"] * 0.95
        assert 0 < r["scaling_efficiency"] <= 1.05 and r["predicted_step_s"] > 0
    assert outcomes(outcome)["data verified on every rank"] == "PASS"
    assert (outcome.workdir / "plots" / "scaling.png").exists()


def test_parameter_server(tmp_path):
    outcome = run("parameter-server", tmp_path, {**SPINE_LEAF, "hosts_per_leaf": 3}, workers=4,
                  steps=2, compute_ms=50)
    phases = outcome.summary["results"]["fabric"]["phases"]
    assert list(phases) == ["bsp", "async", "allreduce"]
    assert all(p["verified"] for p in phases.values())
    checks = outcomes(outcome)
    assert checks["bsp: incast queue at the servers' ports"] == "PASS"
    assert checks["AllReduce steps faster than the parameter server"] == "PASS"
    assert phases["bsp"]["busiest_link_bytes_per_step"] > phases["allreduce"][
        "busiest_link_bytes_per_step"]


def test_tensor_parallel(tmp_path):
    two_nodes = {"name": "nvswitch", "base": "spineleaf", "leaves": 2, "spines": 1,
                 "hosts_per_leaf": 1, "gpus_per_node": 2}
    outcome = run("tensor-parallel", tmp_path, two_nodes, tp_size=2, layers=4, steps=2)
    result = outcome.summary["results"]["fabric"]
    assert all(p["verified"] for p in result["placements"].values())
    comparison = result["comparison"]
    assert comparison["bandwidth_ratio"] == 18.0
    assert comparison["step_difference_s"] > 0
    assert outcomes(outcome)["step time across / inside a node"] == "PASS"


def test_pipeline_parallel(tmp_path):
    outcome = run("pipeline-parallel", tmp_path, micro_batches=4, steps=1)
    schedules = outcome.summary["results"]["fabric"]["schedules"]
    assert schedules["1f1b"]["peak_in_flight_measured"] == [4, 3, 2, 1]
    assert schedules["gpipe"]["peak_in_flight_measured"] == [4, 4, 4, 4]
    assert [c for c in outcome.verdict.checks if c.outcome != "PASS"] == []
    assert (outcome.workdir / "plots" / "gantt-1f1b.png").exists()


def test_torch_ddp(tmp_path):
    pytest.importorskip("torch", reason="the torch extra: scripts/install.sh --extras torch")
    outcome = run("torch-ddp", tmp_path, world=2, steps=3)
    result = outcome.summary["results"]["fabric"]
    assert result["params_identical"] and result["grad_wrong_total"] == 0
    assert result["predicted_step_s"] > 0 and len(result["job_step_s"]) == 3
    checks = outcomes(outcome)
    assert checks["DDP's gradient is the mean of the ranks' gradients"] == "PASS"
    assert checks["parameters identical on every rank"] == checks["the loss falls"] == "PASS"


def test_replay(tmp_path):
    outcome = run("replay", tmp_path, steps=2, scale=0.001, capture_packets=50)
    results = outcome.summary["results"]
    record = results["record"]
    assert record["recording"]["verified"] and record["recording"]["messages"] > 0
    assert record["pcap"]["packets"] == 50
    for setup in ("record", "replay"):
        assert results[setup]["replay"]["verified"], setup
    checks = outcomes(outcome)
    assert checks["replay / recording completion on the same fabric"] == "PASS"
    assert checks["replay fabric / recording fabric completion"] == "PASS"
