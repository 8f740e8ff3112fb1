"""The tensor-parallel experiment: its NVSwitch fabric and the two placements of the group,
the problems, a placement's summary and the comparison computed by hand, the checks PASS and
FAIL, rows and the figure, and both placements measured for real over loopback."""
from __future__ import annotations

import pytest

from tests.unit.loopback_fabric import measure_setups
from testbed.experiments.tensor_parallel.experiment import compare, placement_summary
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import ScenarioError
from testbed.plan.training import cost_links

TWO_NODES = {"name": "nvswitch", "base": "spineleaf", "leaves": 2, "spines": 1,
             "hosts_per_leaf": 1, "gpus_per_node": 2}


def scenario(topology=None, **params):
    data = {"name": "t", "experiment": "tensor-parallel", "link_rate_mbit": 6, "params": params}
    if topology is not None:
        data["topology"] = topology
    return validate(data)


def test_the_default_fabric_and_the_placements():
    exp = scenario().experiment
    fabric = exp.fabric()
    assert fabric.kind == "nvswitch" and len(fabric.hosts) == 16
    assert exp.placements(fabric) == {"inside": ["l0h0g0", "l0h0g1", "l0h0g2", "l0h0g3"],
                                      "across": ["l0h0g0", "l0h1g0", "l1h0g0", "l1h1g0"]}
    two = scenario(TWO_NODES, tp_size=2).experiment
    assert two.placements(two.fabric()) == {"inside": ["l0h0g0", "l0h0g1"],
                                            "across": ["l0h0g0", "l1h0g0"]}


def test_problems():
    with pytest.raises(ScenarioError, match="needs NVSwitch-like nodes"):
        scenario({"name": "fattree", "k": 4})
    with pytest.raises(ScenarioError, match="tp_size: a node has 2 GPUs, the group needs 4"):
        scenario(TWO_NODES)
    with pytest.raises(ScenarioError, match="the fabric has 2 nodes, the group across nodes "
                                            "needs 3"):
        scenario({**TWO_NODES, "gpus_per_node": 4}, tp_size=3)
    with pytest.raises(ScenarioError, match="queue: tensor-parallel sets this itself"):
        validate({"name": "t", "experiment": "tensor-parallel", "queue": {"classes": True}})


def test_the_ranks_arguments():
    exp = scenario(layers=2, scale=0.01).experiment
    fabric = exp.fabric()
    args = exp.rank_args(cost_links(fabric, exp.placements(fabric)["inside"]))
    assert args[:4] == ["--layers", "2", "--hidden", "768"]
    assert args[args.index("--scale") + 1] == "0.01"
    assert float(args[args.index("--link-rate-mbit") + 1]) == pytest.approx(108.0)


def rank(verified=True) -> dict:
    return {"verified": verified, "tcp_retrans_segs": 0}


def head(job: list[float], comm: float, predicted_step: float, predicted_ar: float) -> dict:
    return {**rank(), "job_step_s": job, "steps": [], "mean_comm_s": comm,
            "predicted_step_s": predicted_step, "predicted_allreduce_s": predicted_ar,
            "message_bytes": 12584, "allreduces_per_step": 48}


def placements() -> dict:
    inside = placement_summary(["g0", "g1"], [head([0.3, 0.3], 0.1, 0.25, 0.002), rank()],
                               {"link": {"hops": 2, "rate_mbit": 108.0}})
    across = placement_summary(["g0", "g4"], [head([1.4, 1.6], 1.3, 1.5, 0.0285), rank()],
                               {"link": {"hops": 6, "rate_mbit": 6.0}})
    return {"inside": inside, "across": across}


def test_placements_compared_by_hand():
    p = placements()
    assert p["inside"]["step_s"] == pytest.approx(0.3)
    assert p["inside"]["compute_s"] == pytest.approx(0.2)
    assert p["inside"]["predicted_comm_s"] == pytest.approx(48 * 0.002)
    c = compare(p)
    assert c["step_difference_s"] == pytest.approx(1.2) and c["step_ratio"] == pytest.approx(5.0)
    assert c["predicted_step_ratio"] == pytest.approx(6.0)
    assert c["comm_ratio"] == pytest.approx(13.0)
    assert c["predicted_comm_ratio"] == pytest.approx(0.0285 / 0.002)
    assert c["bandwidth_ratio"] == 18.0
    assert compare({"inside": p["inside"]}) is None


def test_checks_pass_and_fail_by_hand():
    exp = scenario().experiment
    p = placements()
    r = {"fabric": {"placements": p, "comparison": compare(p)}}
    # step ratio 5.0 >= 1.5; 5.0 against 6.0 predicted, within 50% (3.0)
    assert [c.outcome for c in exp.checks(r)] == ["PASS"] * 4
    p["across"] = {**p["across"], "step_s": 0.33, "verified": False, "verified_ranks": 1}
    r = {"fabric": {"placements": p, "comparison": compare(p)}}
    # 0.33 / 0.3 = 1.1 < 1.5, and far below 6.0 * 0.5
    assert [c.outcome for c in exp.checks(r)] == ["PASS", "FAIL", "FAIL", "FAIL"]


def test_rows_and_the_figure(tmp_path):
    exp = scenario().experiment
    p = placements()
    r = {"fabric": {"placements": p, "comparison": compare(p)}}
    rows = dict(exp.rows(r))
    assert rows["bandwidth ratio (inside / across)"] == "18"
    assert rows["communication-time ratio (across / inside)"] == "13.00 (predicted 14.25)"
    assert rows["inside"].startswith("g0, g1: step 0.300 s (predicted 0.250 s)")
    [path] = exp.plots(r, tmp_path, "run | nvswitch | 6 Mbit/s")
    assert path.name == "placements.png" and path.stat().st_size > 10_000


def test_the_bundled_scenario():
    resolved = load("tensor-parallel")
    assert resolved.setups[0].fabric.params["nvlink_ratio"] == 18.0


def test_both_placements_over_loopback(tmp_path):
    resolved = scenario(TWO_NODES, tp_size=2, layers=1, steps=1, scale=0.0005)
    results = measure_setups(resolved, tmp_path)
    r = results["fabric"]
    assert list(r["placements"]) == ["inside", "across"]
    assert r["placements"]["inside"]["cost_model"]["link"]["rate_mbit"] == 108.0
    assert r["placements"]["across"]["cost_model"]["link"]["hops"] == 6
    assert r["comparison"]["bandwidth_ratio"] == 18.0
    outcomes = [c.outcome for c in resolved.experiment.checks(results)]
    assert outcomes[:2] == ["PASS", "PASS"]  # verified in both placements
