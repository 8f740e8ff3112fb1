"""The collectives-sweep experiment: its sweeps and parameters, the plan of sizes, the ranks'
arguments, its checks PASS and FAIL on results written by hand, its rows and figure, and a
short sweep measured for real over loopback (tests/unit/loopback_fabric.py)."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.unit.loopback_fabric import measure_setups
from testbed.experiments.collectives_sweep.experiment import (
    SweepParams,
    judged_window,
    parse_sweep,
    row_cell,
)
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import ScenarioError
from testbed.plan.training import cost_links

MIB = 2**20
SMALL = {"topology": {"name": "spineleaf", "leaves": 2, "spines": 1, "hosts_per_leaf": 2},
         "link_rate_mbit": 6}


def scenario(**params):
    return validate({"name": "s", "experiment": "collectives-sweep", **SMALL, "params": params})


def test_sweeps_name_an_op_and_an_algorithm():
    assert parse_sweep("allreduce") == ("allreduce", "ring")
    assert parse_sweep("alltoall") == ("alltoall", "pairwise")
    assert parse_sweep("broadcast:tree") == ("broadcast", "tree")
    assert parse_sweep("allreduce:auto") == ("allreduce", "auto")
    with pytest.raises(ValueError, match="unknown collective 'reduce'"):
        parse_sweep("reduce")
    with pytest.raises(ValueError, match="allgather has no algorithm 'tree'"):
        parse_sweep("allgather:tree")


def test_params_defaults_and_refusals():
    p = SweepParams()
    assert p.sweeps[:2] == ["allreduce:ring", "allreduce:auto"]
    assert (p.min_bytes, p.max_bytes, p.busbw_claim_bytes) == (8, 2 * MIB, 8 * MIB)
    assert p.expect_busbw_fraction == 0.9
    with pytest.raises(ValidationError, match="lists a sweep twice"):
        SweepParams(sweeps=["allreduce", "allreduce:ring"])
    with pytest.raises(ValidationError, match="unknown collective"):
        SweepParams(sweeps=["gather"])
    with pytest.raises(ValidationError):
        SweepParams(step_factor=1)
    with pytest.raises(ValidationError):
        SweepParams(iters=0)


def test_the_ring_allreduce_runs_on_to_the_claims_size():
    exp = scenario(sweeps=["allreduce:ring", "alltoall"], max_bytes=65536,
                   busbw_claim_bytes=MIB).experiment
    assert exp.plan() == [("allreduce", "ring", MIB), ("alltoall", "pairwise", 65536)]
    exp = scenario(sweeps=["allreduce"], max_bytes=4 * MIB, busbw_claim_bytes=MIB).experiment
    assert exp.plan() == [("allreduce", "ring", 4 * MIB)]


def test_problems_are_named_by_field():
    with pytest.raises(ScenarioError, match="max_bytes: must be at least min_bytes"):
        scenario(min_bytes=1024, max_bytes=64)
    with pytest.raises(ScenarioError, match="ranks: 5 ranks need 5 hosts; the fabric has 4"):
        scenario(ranks=5)
    with pytest.raises(ScenarioError, match="hierarchical needs ranks in several groups"):
        scenario(sweeps=["allreduce:hierarchical"], placement="spread", ranks=2)


def test_node_groups_only_where_a_sweep_can_use_them():
    exp = scenario(sweeps=["allreduce:auto"]).experiment
    fabric = exp.fabric()
    assert exp.groups(fabric, exp.hosts(fabric)) == [[0, 1], [2, 3]]
    exp = scenario(sweeps=["allreduce:ring", "alltoall"]).experiment
    assert exp.groups(fabric, exp.hosts(fabric)) is None


def test_the_ranks_arguments():
    exp = scenario(sweeps=["allreduce:hierarchical"], min_bytes=8, max_bytes=1024,
                   busbw_claim_bytes=1024, warmup=1, iters=3, channels=2).experiment
    fabric = exp.fabric()
    hosts = exp.hosts(fabric)
    groups = exp.groups(fabric, hosts)
    cost = cost_links(fabric, hosts, groups)
    args = exp.rank_args("allreduce", "hierarchical", 1024, cost, groups)
    assert args[:16] == ["--op", "allreduce", "--algo", "hierarchical", "-b", "8", "-e", "1024",
                         "-f", "2", "-w", "1", "-n", "3", "--channels", "2"]
    assert args[16:18] == ["--seed", "1"]
    assert args[18:22:2] == ["--link-rate-mbit", "--alpha-us"]
    assert args[-2:] == ["--groups", "0,1/2,3"]


def row(size_bytes: int, busbw_mbit_s: float, time_us: float, predicted_us: float,
        wrong: int = 0) -> dict:
    return {"size_bytes": size_bytes, "count": size_bytes // 4, "type": "float", "redop": "sum",
            "root": -1, "algorithm": "ring", "time_us": time_us, "time_us_max": time_us,
            "algbw_gbyte_s": busbw_mbit_s / 8e3 / 1.5, "busbw_gbyte_s": busbw_mbit_s / 8e3,
            "algbw_mbit_s": busbw_mbit_s / 1.5, "busbw_mbit_s": busbw_mbit_s, "wrong": wrong,
            "predicted_us": predicted_us, "predicted_busbw_gbyte_s": 0.0007,
            "window_monotonic_s": [10.0 + size_bytes / MIB, 11.0 + size_bytes / MIB]}


def results(ring_rows: list[dict], wrong_total: int = 0, verified_ranks: int = 4) -> dict:
    sweep = {"op": "allreduce", "algorithm": "ring", "world": 4, "rows": ring_rows,
             "wrong_total": wrong_total, "verified_ranks": verified_ranks}
    return {"fabric": {"link_rate_mbit": 6.0, "sweeps": {"allreduce-ring": sweep},
                       "cost_model": {"source": "derived", "link": {"hops": 4}}}}


def outcomes(checks) -> dict:
    return {c.name: c.outcome for c in checks}


def test_checks_pass_by_hand():
    exp = scenario(sweeps=["allreduce:ring"], max_bytes=4 * MIB).experiment
    # 8 MiB: busbw 5.7 of 6 Mbit/s = 95% >= 90%; 1.1 s against 1.0 s predicted: 10% off
    r = results([row(4 * MIB, 5.5, 5e5, 5e5), row(8 * MIB, 5.7, 1.1e6, 1.0e6)])
    checks = exp.checks(r)
    assert outcomes(checks) == {
        "allreduce-ring: #wrong": "PASS",
        "ring AllReduce busbw / link rate at 8388608 B": "PASS",
        "ring AllReduce time / predicted at the largest size": "PASS"}
    busbw = checks[1]
    assert busbw.measured == pytest.approx(0.95) and busbw.expected == ">= 0.9"


def test_checks_fail_by_hand():
    exp = scenario(sweeps=["allreduce:ring"], max_bytes=4 * MIB).experiment
    # 5 of 6 Mbit/s = 83% < 90%; 1.3 s against 1.0 s: 30% off > 20%; 3 wrong elements
    r = results([row(8 * MIB, 5.0, 1.3e6, 1.0e6, wrong=3)], wrong_total=3, verified_ranks=3)
    assert set(outcomes(exp.checks(r)).values()) == {"FAIL"}


def test_no_size_at_the_claim_is_not_judged():
    exp = scenario(sweeps=["allreduce:ring"]).experiment
    checks = exp.checks(results([row(MIB, 5.9, 1e5, 1e5)]))
    assert outcomes(checks)["ring AllReduce busbw / link rate"] == "n/a"


def test_the_judged_window_is_the_largest_size_where_bandwidth_bound():
    sweeps = results([row(MIB, 5.9, 1e5, 1e5), row(2 * MIB, 5.9, 1e5, 1e5)])["fabric"]["sweeps"]
    # predicted busbw 0.0007 GB/s = 5.6 Mbit/s: at least half of 6 Mbit/s
    assert judged_window(sweeps, 6.0) == [12.0, 13.0]
    assert judged_window(sweeps, 12.0) is None  # 5.6 < 6: latency-bound, judged as a whole
    other = {"alltoall": {"rows": [row(4 * MIB, 5.9, 1e5, 1e5)]}, **sweeps}
    assert judged_window(other, 6.0) == [14.0, 15.0]  # the largest size of any sweep
    assert judged_window({}, 6.0) is None


def test_rows_and_the_figure(tmp_path):
    exp = scenario(sweeps=["allreduce:ring"]).experiment
    r = results([row(MIB, 5.4, 1e5, 0.9e5), row(2 * MIB, 5.7, 2e5, 1.9e5)])
    rows = exp.rows(r)
    assert rows[1][0] == "allreduce-ring 1048576 B"
    assert "busbw 0.000675 GB/s = 90% of the link" in rows[1][1]
    assert row_cell(r["fabric"]["sweeps"]["allreduce-ring"]["rows"][1], 6.0).endswith(
        "#wrong 0; predicted 190000.0 us")
    [path] = exp.plots(r, tmp_path, "run | spineleaf | 6 Mbit/s")
    assert path.name == "busbw.png" and path.stat().st_size > 10_000


def test_the_bundled_scenario():
    resolved = load("collectives-sweep")
    exp = resolved.experiment
    assert [s.name for s in resolved.setups] == ["fabric"]
    assert len(resolved.setups[0].fabric.hosts) == 16
    assert exp.plan()[0] == ("allreduce", "ring", 8 * MIB)
    assert [a for _, a, _ in exp.plan()] == ["ring", "auto", "ring", "ring", "pairwise", "ring"]


def test_a_short_sweep_over_loopback(tmp_path):
    resolved = validate({"name": "s", "experiment": "collectives-sweep", **SMALL, "params": {
        "sweeps": ["allreduce:ring", "alltoall"], "min_bytes": 64, "max_bytes": 4096,
        "busbw_claim_bytes": 8192, "iters": 1, "channels": 1}})
    results_ = measure_setups(resolved, tmp_path)
    r = results_["fabric"]
    assert list(r["sweeps"]) == ["allreduce-ring", "alltoall-pairwise"]
    ring = r["sweeps"]["allreduce-ring"]
    assert [x["size_bytes"] for x in ring["rows"]] == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert ring["verified_ranks"] == 4 and ring["wrong_total"] == 0
    assert r["cost_model"]["link"] == {"hops": 4, "rate_mbit": 6.0, "alpha_us": 582.0}
    assert (tmp_path / "fabric" / "nccl-tests-alltoall-pairwise.txt").read_text().startswith(
        "#       size")
    assert "generators" in r["fidelity"]
    checks = outcomes(resolved.experiment.checks(results_))
    assert checks["allreduce-ring: #wrong"] == checks["alltoall-pairwise: #wrong"] == "PASS"


def test_the_ring_sweep_reaches_the_busbw_claim_whatever_the_step():
    from testbed.experiments.collectives_sweep.experiment import first_size_at_least
    from testbed.traffic.collectives.sweep import sweep_sizes

    for factor in (2, 3, 1.5, 4):
        top = first_size_at_least(1, 8 * 2**20, factor)
        assert max(sweep_sizes(1, top, factor)) >= 8 * 2**20, factor
    assert first_size_at_least(1, 8 * 2**20, 3) == 3**15  # 14348907: 3**14 is 4.8 MB
    assert first_size_at_least(8, 64, 2) == 64
