"""torch DDP on the fabric: the rank program's model shapes and the generator's prediction
for them computed by hand, the buckets torch's DDP really forms against the prediction's,
the refusal without torch, and the experiment: its ranks' command lines (rendezvous at rank
0, gloo on each host's fabric interface), the summary, checks PASS and FAIL by hand, rows,
the figure, and a real 2-rank gloo job over loopback."""
from __future__ import annotations

import sys

import pytest

import testbed.experiments.torch_ddp.experiment as torch_experiment
from tests.unit.loopback_fabric import measure_setups
from testbed.experiments.torch_ddp.experiment import fabric_interface, training_summary
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import ScenarioError
from testbed.plan.training import cost_links
from testbed.traffic.collectives.cost import link_alpha_beta
from testbed.traffic.training.ddp import MIB
from testbed.traffic.training.torch_ddp import (
    TORCH_MISSING,
    body,
    mlp_shapes,
    model_shapes,
    predict_step,
)

SMALL = {"topology": {"name": "spineleaf", "leaves": 2, "spines": 1, "hosts_per_leaf": 2},
         "link_rate_mbit": 6}
SHAPES = mlp_shapes(256, 128, 2, 16)


def test_the_perceptrons_shapes_as_torch_names_them():
    assert SHAPES == [("0.weight", (128, 256)), ("0.bias", (128,)), ("2.weight", (128, 128)),
                      ("2.bias", (128,)), ("4.weight", (16, 128)), ("4.bias", (16,))]
    assert mlp_shapes(4, 8, 1, 2) == [("0.weight", (8, 4)), ("0.bias", (8,)),
                                      ("2.weight", (2, 8)), ("2.bias", (2,))]
    assert model_shapes(SHAPES).total_params == 51472


def test_the_prediction_by_hand():
    # 8 Mbit/s: 1 us per byte; no latency; 2 ranks: a ring moves S bytes per rank
    link = link_alpha_beta(8.0)
    p = predict_step(model_shapes(SHAPES), 2, link, round(0.05 * MIB), forward_s=0.05,
                     backward_s=0.1, optimizer_s=0.01)
    # gradients in reverse: 64 + 8192 + 512 + 65536 = 74304 B crosses the 52429 B cap
    assert p["bucket_bytes"] == [74304, 131584]
    ready0 = 0.1 * (16 + 2048 + 128 + 16384) / 51472  # its last gradient: 2.weight
    b0, b1 = p["buckets"]
    assert b0["ready_s"] == pytest.approx(0.05 + ready0)
    assert b0["end_s"] == pytest.approx(0.05 + ready0 + 0.074304)
    assert b1["start_s"] == pytest.approx(b0["end_s"])  # ready at 0.15, the link still busy
    assert p["step_s"] == pytest.approx(0.05 + ready0 + 0.074304 + 0.131584)
    assert p["predicted_step_s"] == pytest.approx(p["step_s"] + 0.01)


def test_torch_forms_the_buckets_the_prediction_assumes(monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tests.unit.ranks import free_ports

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_ports(1)[0]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 16))
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.05)
        for _ in range(3):  # DDP rebuilds its buckets after the first iterations
            ddp(torch.randn(4, 256)).sum().backward()
        rebuilt = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    finally:
        dist.destroy_process_group()
    predicted = predict_step(model_shapes(SHAPES), 1, link_alpha_beta(8.0), round(0.05 * MIB),
                             0.0, 0.0, 0.0)["bucket_bytes"]
    assert [int(x) for x in str(rebuilt).split(",")] == predicted


def test_without_torch_the_program_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert body(["--rank", "0", "--hosts", "127.0.0.1"]) == {"error": TORCH_MISSING,
                                                              "verified": False}


def test_without_torch_the_scenario_is_refused(monkeypatch):
    monkeypatch.setattr(torch_experiment, "torch_installed", lambda: False)
    with pytest.raises(ScenarioError, match="experiment: torch is not installed: "
                                            r"scripts/install.sh --extras torch"):
        load("torch-ddp")


def test_each_rank_meets_at_rank_0_with_gloo_on_its_fabric_interface():
    exp = validate({"name": "t", "experiment": "torch-ddp", **SMALL,
                    "params": {"world": 2}}).experiment
    fabric = exp.fabric()
    assert fabric_interface(fabric, "l1h0") == "l1h0-eth0"
    hosts = ["l0h0", "l1h0"]
    ranks = exp.launches(fabric, hosts, cost_links(fabric, hosts))
    assert [r.host for r in ranks] == hosts
    argv = ranks[1].argv
    assert argv[2:10] == ["testbed.traffic.training.torch_ddp", "--rank", "1", "--hosts",
                          "10.0.0.2,10.0.1.2", "--port", "29500", "--ifname"]
    assert argv[10] == "l1h0-eth0"
    assert argv[argv.index("--bucket-cap-mb") + 1] == "0.05"
    assert "--link-rate-mbit" in argv


def result(step_s=0.1, predicted=0.08, wrong=0, identical=True, losses=(1.0, 0.5)) -> dict:
    head = {"world": 2, "params": 100, "param_bytes": 400, "job_step_s": [step_s, step_s],
            "mean_step_s": step_s, "forward_s": 0.001, "backward_s": 0.002,
            "optimizer_s": 0.001, "predicted": {"predicted_step_s": predicted, "comm_s": 0.07,
                                                "bucket_bytes": [400]},
            "loss_before": losses[0], "loss_after": losses[1], "grad_wrong_total": wrong,
            "params_identical": identical, "verified": identical and wrong == 0,
            "tcp_retrans_segs_total": 0, "timed_window_monotonic_s": [1.0, 2.0]}
    return {"fabric": {"hosts": ["a", "b"], **training_summary([head, {"verified": True}])}}


def test_checks_pass_and_fail_by_hand():
    exp = load("torch-ddp").experiment
    # 0.1 s against 0.08 s predicted: 25% off, within 50%
    assert [c.outcome for c in exp.checks(result())] == ["PASS"] * 4
    # 3 wrong gradients, replicas apart, the loss rising, 0.3 s against 0.08 s: 275% off
    bad = exp.checks(result(step_s=0.3, wrong=3, identical=False, losses=(0.5, 1.0)))
    assert [c.outcome for c in bad] == ["FAIL"] * 4
    no_model = result()
    no_model["fabric"]["predicted_step_s"] = None
    assert exp.checks(no_model)[-1].outcome == "n/a"


def test_rows_and_the_figure(tmp_path):
    exp = load("torch-ddp").experiment
    rows = dict(exp.rows(result()))
    assert rows["training"].startswith("100 parameters, step 100.0 ms (predicted 80.0 ms")
    assert "held-out loss 1.0000 -> 0.5000" in rows["training"]
    assert rows["buckets (predicted)"] == "400 B"
    [path] = exp.plots(result(), tmp_path, "run | fattree | 6 Mbit/s")
    assert path.name == "torch_ddp_steps.png" and path.stat().st_size > 10_000


def test_a_gloo_job_over_loopback(tmp_path):
    pytest.importorskip("torch")
    resolved = validate({"name": "t", "experiment": "torch-ddp", **SMALL,
                         "params": {"world": 2, "steps": 2}})
    results = measure_setups(resolved, tmp_path)
    r = results["fabric"]
    assert r["hosts"] == ["l0h0", "l1h0"] and r["params"] == 51472
    assert r["bucket_bytes"] == [74304, 131584]
    assert r["predicted_step_s"] > 0 and len(r["job_step_s"]) == 2
    outcomes = [c.outcome for c in resolved.experiment.checks(results)]
    assert outcomes[:3] == ["PASS", "PASS", "PASS"]  # gradients, replicas, loss
