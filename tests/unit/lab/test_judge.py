"""Judging items against summaries, by hand: an experiment's check by name (exact, a
pattern, a setup), a value within bounds (the bounds of the path the run took), a yes/no
claim, a comparison across runs, and when an item is not judged: a missing run, a run that
did not complete, a run the emulator did not keep up with, nothing measured."""
from __future__ import annotations

import copy

import pytest

from testbed.lab.judge import NOT_JUDGED, judge, judge_item, run_paths
from testbed.lab.spec import CheckFile, Item, Lab, Manifest
from testbed.model.verdict import FAIL, PASS


def check(name, passed, setup=None, measured=1.0):
    return {"name": name, "setup": setup, "measured": measured, "expected": ">= 1",
            "passed": passed}


SUMMARY = {
    "status": "complete", "error": None, "ecn_path": None,
    "provenance": {"paths": {"ovs_datapath": "userspace", "ecn_marking": "ebpf",
                             "tcp_congestion": "cubic+ecn", "rdma": "userspace-roce"}},
    "params": {"stages": 4, "micro_batches": 8},
    "results": {"n2-ecn": {"median": 3.0, "marks": 500, "drops": 0},
                "n2-droptail": {"median": 70.0}, "fabric": {"bubble": 0.28, "none": None}},
    "verdict": {"emulator_trusted": True, "reasons": [], "checks": [
        check("busbw / link rate", True),
        check("stride4: ECMP > single-path", True), check("stride8: ECMP > single-path", True),
        check("queue sampled", True, "n2-ecn"), check("queue sampled", False, "n2-droptail"),
        check("ECMP spread", None)]},
}


def item(**fields) -> Item:
    return Item.model_validate({"name": "claim", **fields})


def outcome(summary=SUMMARY, **fields) -> tuple[str, str, str]:
    result = judge_item(item(**fields), "a", {"a": summary})
    return result.outcome, result.measured, result.reason


def with_(**changes) -> dict:
    summary = copy.deepcopy(SUMMARY)
    for key, value in changes.items():
        summary[key] = value
    return summary


@pytest.mark.parametrize(("fields", "expected"), [
    ({"check": "busbw / link rate"}, PASS),
    ({"check": "stride*: ECMP > single-path"}, PASS),
    ({"check": "queue sampled", "setup": "n2-ecn"}, PASS),
    ({"check": "queue sampled", "setup": "n2-droptail"}, FAIL),
    ({"check": "queue sampled"}, FAIL),  # every setup's: one failed
    ({"check": "ECMP spread"}, NOT_JUDGED),
    ({"check": "no such check"}, FAIL),
    ({"check": "queue sampled", "setup": "n8-ecn"}, FAIL),
])
def test_a_check_item_passes_when_every_check_it_names_passed(fields, expected):
    assert outcome(**fields)[0] == expected


def test_a_missing_check_says_so():
    assert outcome(check="no such check")[2] == "the run has no check 'no such check'"


@pytest.mark.parametrize(("fields", "expected"), [
    ({"value": "results.n2-ecn.median", "max": 4.5}, (PASS, "3")),
    ({"value": "results.n2-ecn.median", "min": 3.5}, (FAIL, "3")),
    ({"value": "results.n2-ecn.median", "min": 1, "max": 2}, (FAIL, "3")),
    ({"values": {"e": "results.n2-ecn.median", "d": "results.n2-droptail.median"},
      "expr": "e / d", "max": 0.05}, (PASS, "0.04286")),
    ({"values": {"m": "results.n2-ecn.marks", "d": "results.n2-ecn.drops"},
      "expr": "m > 0 and d * 100 < m"}, (PASS, "True")),
    ({"values": {"b": "results.fabric.bubble", "p": "params.stages", "m": "params.micro_batches"},
      "expr": "abs(b - (p - 1) / (m + p - 1)) / ((p - 1) / (m + p - 1))", "max": 0.1},
     (PASS, "0.02667")),
])
def test_a_value_item_is_judged_against_its_bounds(fields, expected):
    assert outcome(**fields)[:2] == expected


def test_a_value_that_is_not_there_fails_and_one_not_measured_is_not_judged():
    assert outcome(value="results.n2-ecn.p95", max=1)[0] == FAIL
    assert "summary.json has no results.n2-ecn.p95" in outcome(value="results.n2-ecn.p95",
                                                              max=1)[2]
    assert outcome(value="results.fabric.none", max=1)[:1] == (NOT_JUDGED,)
    assert outcome(values={"a": "results.n2-ecn.drops"}, expr="1 / a", max=1)[0] == NOT_JUDGED
    assert outcome(value="results.n2-ecn.median")[0] == FAIL  # a number is not a yes/no claim
    assert outcome(values={"a": "results.n2-ecn.median"}, expr="a > 1", max=1)[0] == FAIL


def test_by_path_bounds_apply_on_the_path_the_run_took():
    fields = {"value": "results.n2-ecn.median", "max": 2,
              "by_path": [{"when": {"ecn_path": "red-qdisc"}, "max": 4, "note": "RED"}]}
    assert outcome(**fields)[0] == FAIL  # the eBPF marker: max 2
    red = with_(ecn_path="red-qdisc")
    result = judge_item(item(**fields), "a", {"a": red})
    assert (result.outcome, result.expected) == (PASS, "<= 4 (ecn_path red-qdisc: RED)")
    kernel = copy.deepcopy(SUMMARY)
    kernel["provenance"]["paths"]["ecn_marking"] = "red-qdisc"  # the machine's, when unset
    assert judge_item(item(**fields), "a", {"a": kernel}).outcome == PASS


def test_the_paths_a_run_took_are_read_defensively():
    assert run_paths(SUMMARY) == {"datapath": "userspace", "ecn_path": "ebpf",
                                  "tcp_cc": "cubic+ecn", "rdma": "userspace-roce"}
    assert run_paths({}) == {"datapath": None, "ecn_path": None, "tcp_cc": None, "rdma": None}


def test_an_item_of_several_conditions_fails_when_one_fails():
    both = [{"check": "busbw / link rate"}, {"value": "results.n2-ecn.median", "max": 4}]
    assert outcome(all=both)[0] == PASS
    assert outcome(all=[*both, {"check": "queue sampled", "setup": "n2-droptail"}])[0] == FAIL
    assert outcome(all=[*both, {"check": "ECMP spread"}])[0] == NOT_JUDGED


@pytest.mark.parametrize(("summary", "reason"), [
    (with_(verdict={**SUMMARY["verdict"], "emulator_trusted": False,
                    "reasons": ["busiest link delivery: 0.8 (expected >= 0.85)"]}),
     "the emulator did not keep up: busiest link delivery: 0.8 (expected >= 0.85) "
     "(would be PASS)"),
    (with_(status="failed", error="the fabric did not come up"),
     "the run is failed: the fabric did not come up (would be PASS)"),
    (with_(verdict=None), "the emulator did not keep up: no trust verdict in summary.json"),
])
def test_an_untrusted_or_unfinished_run_judges_nothing(summary, reason):
    got, _, said = outcome(summary, check="busbw / link rate")
    assert got == NOT_JUDGED and said.startswith(reason.split(" (would")[0])
    failing, _, said = outcome(summary, check="queue sampled", setup="n2-droptail")
    assert failing == NOT_JUDGED  # never FAIL either: the numbers decide nothing


def lab(items, runs=("a", "b")) -> Lab:
    manifest = Manifest.model_validate({"title": "t", "runs": [
        {"name": r, "scenario": f"{r}.yaml"} for r in runs]})
    return Lab(1, "t", None, manifest, CheckFile.model_validate({"items": items}))


def test_items_compare_runs_and_doubt_any_run_they_read():
    compare = {"name": "a beats b", "values": {"x": "a:results.n2-ecn.median",
                                               "y": "b:results.n2-ecn.median"},
               "expr": "x - y", "max": 0.5}
    slower = copy.deepcopy(SUMMARY)
    slower["results"]["n2-ecn"]["median"] = 2.8
    check = judge(lab([compare]), {"a": SUMMARY, "b": slower})
    assert [(i.outcome, i.measured) for i in check.items] == [(PASS, "0.2")]
    slower["verdict"]["emulator_trusted"] = False
    (result,) = judge(lab([compare]), {"a": SUMMARY, "b": slower}).items
    assert result.outcome == NOT_JUDGED and result.reason.startswith("b: the emulator")
    (result,) = judge(lab([compare]), {"a": SUMMARY}).items
    assert (result.outcome, result.reason) == (NOT_JUDGED, "no summary of run b")


def test_a_self_check_passes_only_when_every_item_passed():
    items = [{"name": "one", "check": "busbw / link rate"},
             {"name": "two", "run": "b", "check": "ECMP spread"}]
    check = judge(lab(items), {"a": SUMMARY, "b": SUMMARY}, {"a": "/r/a", "b": "/r/b"})
    assert [i.outcome for i in check.items] == [PASS, NOT_JUDGED] and not check.passed
    assert check.counts() == {PASS: 1, FAIL: 0, NOT_JUDGED: 1}
    assert check.headline() == ("lab 01-t: NOT PASSED: 1 of 2 items passed, 0 failed, "
                                "1 not judged")
    assert check.rows()[0] == ["outcome", "item", "run", "measured", "expected",
                               "why / reason"]
    assert check.to_dict()["run_dirs"] == {"a": "/r/a", "b": "/r/b"}
    assert judge(lab(items[:1]), {"a": SUMMARY}).passed
