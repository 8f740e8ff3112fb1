"""The AllReduce experiment's pure parts: ECMP spread from link rates, the ranks' results as
nccl-tests reports them, rank 0's progress lines, and its parameters."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from testbed.experiments.allreduce.experiment import (
    AllReduceParams,
    ecmp_spread,
    summarise,
)
from testbed.drive.ranks import rank_progress
from testbed.measure.stats import jain_index
from testbed.measure.telemetry import link_directions
from testbed.model.topology.fattree import fat_tree

# --- ECMP spread -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fabric():
    return fat_tree(4, host_rate_mbit=10.0)


def zero_rates(fabric) -> dict[str, float]:
    return {d.label: 0.0 for d in link_directions(fabric)}


def test_no_traffic_no_spread(fabric):
    assert ecmp_spread(fabric, "ecmp", zero_rates(fabric)) == {
        "switches": {}, "jain_mean": None, "uplinks_used": 0, "uplinks_in_groups": 0,
        "spread": False}


def test_even_split_on_one_edge_switch(fabric):
    rates = zero_rates(fabric)
    rates["p0e0->p0a0"] = 3.0
    rates["p0e0->p0a1"] = 3.0
    rates["p0e0->p0e0h0"] = 50.0  # downlinks are not group ports and are ignored
    assert ecmp_spread(fabric, "ecmp", rates) == {
        "switches": {"p0e0": {"uplink_mbit": [3.0, 3.0], "jain": 1.0}},
        "jain_mean": 1.0, "uplinks_used": 2, "uplinks_in_groups": 2, "spread": True}


def test_all_on_one_uplink_is_no_spread(fabric):
    rates = zero_rates(fabric)
    rates["p1e1->p1a1"] = 6.0
    rates["p1a0->c1"] = 2.0
    rates["p1a0->c0"] = 0.2   # under the 0.5 Mbit/s "carried traffic" mark
    result = ecmp_spread(fabric, "ecmp", rates)
    assert result["switches"] == {
        "p1a0": {"uplink_mbit": [0.2, 2.0], "jain": round(jain_index([0.2, 2.0]), 3)},
        "p1e1": {"uplink_mbit": [0.0, 6.0], "jain": 0.5},
    }
    assert result["uplinks_used"] == 2
    assert result["uplinks_in_groups"] == 4
    assert result["jain_mean"] == round((0.5 + round(jain_index([0.2, 2.0]), 3)) / 2, 3)
    assert result["spread"] is False


def test_groups_with_negligible_load_are_left_out(fabric):
    threshold_mbit = 0.01 * fabric.params["host_rate_mbit"]
    rates = zero_rates(fabric)
    rates["p2e0->p2a0"] = threshold_mbit / 2
    rates["p2e0->p2a1"] = threshold_mbit / 2  # sum equals the threshold: not counted
    rates["p3a1->c2"] = threshold_mbit
    rates["p3a1->c3"] = threshold_mbit       # above it: counted
    result = ecmp_spread(fabric, "ecmp", rates)
    assert list(result["switches"]) == ["p3a1"]


def test_single_path_routing_has_no_groups_to_spread(fabric):
    rates = {label: 5.0 for label in zero_rates(fabric)}
    result = ecmp_spread(fabric, "single", rates)
    assert result["switches"] == {} and result["spread"] is False
    assert result["jain_mean"] is None


def test_every_group_switch_reported_under_uniform_load(fabric):
    rates = {label: 5.0 for label in zero_rates(fabric)}
    result = ecmp_spread(fabric, "ecmp", rates)
    edges_and_aggs = {s.name for s in fabric.switches if s.role in ("edge", "aggregation")}
    assert set(result["switches"]) == edges_and_aggs
    assert all(v == {"uplink_mbit": [5.0, 5.0], "jain": 1.0} for v in result["switches"].values())
    assert result["uplinks_used"] == result["uplinks_in_groups"] == 2 * len(edges_and_aggs)
    assert result["jain_mean"] == 1.0 and result["spread"] is True


# --- parameters -------------------------------------------------------------------------------


def test_defaults():
    p = AllReduceParams()
    assert (p.size_bytes, p.channels, p.warmup, p.iters) == (2 * 1024 * 1024, 4, 1, 3)


@pytest.mark.parametrize(("field", "value"), [
    ("size_bytes", 1023), ("size_bytes", 1026), ("size_bytes", 0), ("channels", 0),
    ("channels", 17), ("warmup", -1), ("warmup", 101), ("iters", 0), ("iters", 1001),
    ("expect_busbw_fraction", 0), ("expect_busbw_fraction", 1.5),
])
def test_params_refuse_out_of_range_values_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        AllReduceParams(**{field: value})
    assert info.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(("field", "value"), [
    ("size_bytes", 1024), ("channels", 1), ("channels", 16), ("warmup", 0), ("warmup", 100),
    ("iters", 1), ("iters", 1000), ("expect_busbw_fraction", 1.0)])
def test_params_accept_the_limits(field, value):
    assert getattr(AllReduceParams(**{field: value}), field) == value


# --- the ranks' results ------------------------------------------------------------------------


def rank(times, window, verified=True, out=100, retrans=1, channels_used=4):
    return {"times_s": times, "timed_window_monotonic_s": window, "verified": verified,
            "tcp_out_segs": out, "tcp_retrans_segs": retrans, "channels_used": channels_used}


def test_summary_takes_the_slowest_rank_per_iteration():
    # 4 ranks, 2 iterations: the slowest of each is 2.0 and 4.0, mean 3.0 s
    results = [rank([1.0, 4.0], [10.0, 15.0]), rank([2.0, 3.0], [10.1, 15.2]),
               rank([1.5, 3.5], [9.9, 15.1], verified=False), rank([1.0, 1.0], [10.0, 14.0])]
    s = summarise(results, size_bytes=3_000_000, rate_mbit=10.0)
    assert s["iteration_s"] == [2.0, 4.0] and s["time_s"] == 3.0
    assert s["verified"] is False and s["verified_ranks"] == 3
    # algbw 3e6 B / 3 s = 1e6 B/s = 0.001 GB/s; busbw x 2(n-1)/n = 1.5 -> 0.0015 GB/s = 12 Mbit/s
    assert s["algbw_gbyte_s"] == pytest.approx(0.001)
    assert s["busbw_mbit_s"] == pytest.approx(12.0)
    assert s["busbw_fraction_of_link"] == pytest.approx(1.2)
    # the links are judged while every rank was timing; the span is kept beside it
    assert s["timed_window_monotonic_s"] == [10.1, 14.0]
    assert s["window_monotonic_s"] == [9.9, 15.2]
    assert s["tcp"] == {"segments_sent": 400, "segments_retransmitted": 4}
    assert s["channels_used"] == 4


def test_rank0_progress_reads_its_progress_lines(tmp_path):
    path = tmp_path / "rank0.err"
    assert rank_progress(path) == 0  # not written yet
    path.write_text("warning: something\n" + "".join(
        f"progress {json.dumps({'done': i, 'of': 4})}\n" for i in (1, 2)))
    assert rank_progress(path) == 2




def test_ecmp_spread_is_not_judged_when_the_ranks_ran_one_channel():
    from testbed.experiments.registry import load
    from testbed.model.verdict import FAIL, NOT_JUDGED

    experiment = load("fattree-allreduce", {}).experiment
    halving = load("fattree-allreduce", {"params.algorithm": "hd"}).experiment
    spread = {"switches": ["p0e0", "p0e1"], "spread": False, "uplinks_used": 2,
              "uplinks_in_groups": 4, "jain_mean": 1.0}
    fabric = {"verified_ranks": 16, "world": 16, "busbw_fraction_of_link": 0.95,
              "busbw_mbit_s": 5.7, "link_rate_mbit": 6.0, "ecmp": spread}

    def outcome(channels_used, exp=experiment):
        checks = exp.checks({"fabric": {**fabric, "channels_used": channels_used}})
        return next(c.outcome for c in checks if c.name.startswith("ECMP spread"))

    assert outcome(4) == FAIL
    assert outcome(1) == NOT_JUDGED
    # halving-doubling talks to several peers even on one channel: still judged
    assert outcome(1, halving) == FAIL
