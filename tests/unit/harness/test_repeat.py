"""Repeated runs (testbed.harness.repeat): every headline number's median, min, max and N
over the runs, checks over the runs, a verdict that passes only when every run passed and
was trusted (naming those that did not), and ``run_repeated`` end to end around the
stand-in network: each run on a fabric of its own, its folder inside the repeat's, progress
lines, and a run that fails stopping the repeat with what was measured still written."""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from tests.unit.stand_ins import StandInExperiment, StandInFabric, standins  # noqa: F401
from tests.unit.summaries import UNTRUSTED, number, repeat_summary, run_summary

import testbed.cli
import testbed.harness.repeat
from testbed import errors
from testbed.capabilities import detect
from testbed.cli import EXIT_OK, EXIT_USAGE, EXIT_VERDICT, main
from testbed.harness.experiment import Resolved
from testbed.harness.repeat import (
    RepeatOutcome,
    aggregate_checks,
    aggregate_rows,
    eta_text,
    repeat_verdict,
    run_repeated,
    spread,
    spread_text,
)
from testbed.harness.run import Outcome
from testbed.harness.scenario import Scenario
from testbed.harness.summary_schema import read_summary
from testbed.measure.fidelity import judge
from testbed.model.rows import Number, Row
from testbed.model.verdict import Verdict, at_least, at_most, holds

ABS = 1e-9  # the spread is exact arithmetic on the runs' own values


# --- the spread of one number ---------------------------------------------------------------


def test_spread_is_median_min_max_and_n_of_the_runs_that_measured_it():
    s = spread([5.0, None, 7.0, 6.5], "Mbit/s")
    assert s == {"median": 6.5, "min": 5.0, "max": 7.0, "n": 3, "unit": "Mbit/s",
                 "values": [5.0, None, 7.0, 6.5]}
    assert spread([1, 2, 3, 4], "")["median"] == pytest.approx(2.5, abs=ABS)  # even N
    odd = spread([True, math.nan, "x", 3], "s")  # not numbers: not counted
    assert (odd["n"], odd["median"], odd["values"]) == (1, 3.0, [None, None, None, 3.0])
    assert spread([None, None], "s") == {"median": None, "min": None, "max": None, "n": 0,
                                         "unit": "s", "values": [None, None]}


def test_spread_text_gives_the_median_the_range_and_n():
    assert spread_text(spread([5.8, 5.95, 5.91], "Mbit/s")) == "5.91 Mbit/s (5.8 to 5.95, N=3)"
    assert spread_text(spread([0.5], "")) == "0.5 (N=1)"
    assert spread_text(spread([None], "")) == "not measured"


# --- rows and checks over the runs ----------------------------------------------------------


def test_rows_over_the_runs_keep_each_number_by_name():
    runs = [run_summary(rows=[("busbw", "t", number("busbw", 5.0, "Mbit/s"),
                               number("of the link rate", 0.83, "fraction")),
                              ("note", "same")]),
            run_summary(rows=[("busbw", "t", number("busbw", 6.0, "Mbit/s")),
                              ("note", "same"), ("only here", "x")])]
    rows = {row["what"]: row for row in aggregate_rows(runs)}
    assert list(rows) == ["busbw", "note", "only here"]
    busbw, share = rows["busbw"]["numbers"]
    assert (busbw["name"], busbw["median"], busbw["n"]) == ("busbw", 5.5, 2)
    assert share["values"] == [0.83, None] and share["n"] == 1
    assert rows["busbw"]["text"] == ("5.5 Mbit/s (5 to 6, N=2); of the link rate 0.83 "
                                     "fraction (N=1)")
    assert rows["note"] == {"what": "note", "text": "same", "numbers": []}


def test_a_row_whose_text_differs_between_runs_says_so():
    runs = [run_summary(rows=[("mode", "ecn")]), run_summary(rows=[("mode", "drop-tail")])]
    (row,) = aggregate_rows(runs)
    assert row["text"] == "differs between runs; run 1: ecn"


def test_checks_over_the_runs_give_the_spread_and_every_outcome():
    runs = [run_summary(checks=[at_least("busbw", 0.95, 0.9, "fraction"),
                                holds("verified", True)]),
            run_summary(checks=[at_least("busbw", 0.85, 0.9, "fraction")]),
            run_summary(checks=[at_least("busbw", 0.97, 0.9, "fraction"),
                                holds("verified", None)])]
    busbw, verified = aggregate_checks(runs)
    assert busbw["outcomes"] == ["PASS", "FAIL", "PASS"] and busbw["passed"] is False
    assert busbw["measured"]["median"] == pytest.approx(0.95, abs=ABS)
    assert busbw["expected"] == ">= 0.9" and busbw["unit"] == "fraction"
    assert verified["outcomes"] == ["PASS", "-", "n/a"] and verified["passed"] is True
    assert verified["measured"] is None  # yes/no, not a number
    (cpu,) = aggregate_checks(runs, "trust")
    assert cpu["passed"] is True and cpu["measured"]["n"] == 3


# --- the verdict ------------------------------------------------------------------------------


def test_the_repeat_passes_only_when_every_run_passed_and_was_trusted():
    good = run_summary(run_id="g", checks=[at_least("busbw", 0.95, 0.9, "fraction")])
    assert repeat_verdict([good, good], 2) == {"passed": True, "runs_asked": 2,
                                               "runs_made": 2, "runs_passed": 2,
                                               "reasons": []}
    failed = run_summary(run_id="f", checks=[at_least("busbw", 0.85, 0.9, "fraction")])
    untrusted = run_summary(run_id="u", trust=UNTRUSTED)
    stopped = run_summary(run_id="s", status="failed", error="the fabric did not come up")
    v = repeat_verdict([good, failed, untrusted, stopped], 5)
    assert not v["passed"] and v["runs_passed"] == 1 and v["runs_made"] == 4
    assert v["reasons"] == [
        "run 2 (f): check failed: busbw measured 0.85 fraction (expected >= 0.9)",
        "run 3 (u): emulator not trusted: machine CPU busy: 0.99 fraction (expected <= 0.95)",
        "run 4 (s) failed: the fabric did not come up",
        "only 4 of the 5 runs asked for were made"]


def outcome_of(checks=(), trust=(at_most("cpu", 0.4, 0.9, ""),), status="complete"):
    return Outcome({"status": status}, Path("r"), Verdict(list(checks), list(trust)))


@pytest.mark.parametrize(("outcomes", "made", "flags", "code"), [
    ((outcome_of(), outcome_of()), 2, (), 0),
    ((outcome_of(), outcome_of([at_least("a", 0, 1, "")])), 2, (), 1),
    ((outcome_of(), outcome_of([at_least("a", 0, 1, "")])), 2, (True, False), 0),
    ((outcome_of(), outcome_of(trust=[at_most("cpu", 1, 0.9, "")])), 2, (), 1),
    ((outcome_of(), outcome_of(trust=[at_most("cpu", 1, 0.9, "")])), 2, (False, True), 0),
    ((outcome_of(),), 2, (True, True), 1),  # a run short
])
def test_the_exit_status_is_0_only_when_every_run_asked_for_exits_0(outcomes, made, flags,
                                                                    code):
    outcome = RepeatOutcome({"repeat": made}, Path("rep"), list(outcomes))
    assert outcome.exit_status(*flags) == code


def test_eta_at_the_pace_of_the_runs_so_far():
    assert eta_text(1, 5, 0.0) == ""
    assert eta_text(2, 5, 100.0) == " (about 6 min 40 s left)"
    assert eta_text(5, 5, 40.0) == " (about 10 s left)"


# --- run_repeated around the stand-in network -------------------------------------------------


class Varying(StandInExperiment):
    """The stand-in experiment measuring 10, 12, 11, ... ms with the emulator trusted, a
    check on it, and, when ``fail_on`` is set, an error in that run."""

    values = itertools.count()
    fail_on: int | None = None

    def measure(self, run):
        index = next(Varying.values)
        if Varying.fail_on == index + 1:
            raise errors.TestbedError("the workload broke")
        trusted = judge(0.3, 1.0, 0.98, 0.0, True, None).to_dict()  # as StandInWatch's
        return {"value": (10, 12, 11)[index % 3], "fidelity": trusted}

    def checks(self, results):
        return [at_most("value", results["fabric"]["value"], 11.5, "ms")]

    def rows(self, results):
        value = results["fabric"]["value"]
        return [Row("value", f"{value} ms", Number("value", value, "ms"))]


def resolved_for(tmp_path, monkeypatch, fail_on=None) -> Resolved:
    monkeypatch.setattr(Varying, "values", itertools.count())
    monkeypatch.setattr(Varying, "fail_on", fail_on)
    scenario = Scenario(name="standin-run", experiment="standin", link_rate_mbit=6.0,
                        results_dir=str(tmp_path))
    platform = detect()
    experiment = Varying(scenario, Varying.Params(), platform)
    return Resolved(scenario, experiment, platform, experiment.setups(), None)


def test_each_run_is_made_on_a_fresh_fabric_inside_the_repeats_folder(tmp_path, standins,
                                                                         monkeypatch):
    lines: list[str] = []
    outcome = run_repeated(resolved_for(tmp_path, monkeypatch), 3, log=lines.append)
    assert len(StandInFabric.made) == 3 and all(net.stopped for net in StandInFabric.made)
    assert len({id(net) for net in StandInFabric.made}) == 3
    (folder,) = tmp_path.iterdir()
    assert folder == outcome.workdir and "-standin-run-x3-" in folder.name
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "plots")
    assert len(runs) == 3 and all((p / "summary.json").exists() for p in runs)
    summary = read_summary(folder)
    assert summary == outcome.summary and summary["kind"] == "repeat"
    assert [r["dir"] for r in summary["runs"]] == [o.workdir.name for o in outcome.outcomes]
    (row,) = summary["rows"]
    (value,) = row["numbers"]
    assert (value["median"], value["min"], value["max"], value["n"]) == (11, 10, 12, 3)
    assert value["values"] == [10, 12, 11] and row["text"] == "11 ms (10 to 12, N=3)"
    assert not summary["verdict"]["passed"]  # 12 ms > 11.5 in run 2
    (why,) = summary["verdict"]["reasons"]
    assert why.startswith(f"run 2 ({summary['runs'][1]['run_id']}): check failed: value")
    assert outcome.exit_status() == 1
    assert [p["path"] for p in summary["plots"]] == ["plots/spread.png"]
    assert (folder / "plots" / "spread.png").read_bytes().startswith(b"\x89PNG")
    assert summary["report"] == ["report.md", "report.html"]
    progress = [line for line in lines if line.startswith("run ") and "/3" in line]
    assert progress[0] == "run 1/3" and progress[2].startswith("run 2/3 (about ")
    assert progress[1].startswith("run 1/3: complete, 1 checks passed, 0 failed")


def test_a_run_that_fails_stops_the_repeat_and_what_was_measured_is_written(
        tmp_path, standins, monkeypatch):
    resolved = resolved_for(tmp_path, monkeypatch, fail_on=2)
    with pytest.raises(errors.TestbedError, match="the workload broke"):
        run_repeated(resolved, 3, log=lambda m: None)
    assert len(StandInFabric.made) == 2 and all(net.stopped for net in StandInFabric.made)
    (folder,) = tmp_path.iterdir()
    summary = read_summary(folder)
    assert summary["status"] == "failed" and summary["error"] == "the workload broke"
    assert [r["status"] for r in summary["runs"]] == ["complete", "failed"]
    assert summary["verdict"]["reasons"][-2:] == [
        f"run 2 ({summary['runs'][1]['run_id']}) failed: the workload broke",
        "only 2 of the 3 runs asked for were made"]


@pytest.mark.parametrize("repeat", [0, -1, True])
def test_a_repeat_needs_a_whole_number_of_runs(tmp_path, standins, monkeypatch, repeat):
    with pytest.raises(errors.ConfigError, match="repeat: must be a whole number of runs"):
        run_repeated(resolved_for(tmp_path, monkeypatch), repeat)
    assert StandInFabric.made == [] and list(tmp_path.iterdir()) == []


# --- the command -----------------------------------------------------------------------------


def test_run_repeat_runs_n_times_and_exits_by_every_run(monkeypatch, tmp_path, capsys):
    asked = []
    runs = [run_summary(run_id=f"r{i}", results_dir=str(tmp_path / f"r{i}")) for i in (1, 2)]

    def fake(resolved, repeat, log=print, progress=None):
        asked.append((resolved.scenario.name, repeat))
        summary = repeat_summary(runs, repeat_id="rep", folder=tmp_path)
        return RepeatOutcome(summary, tmp_path, [outcome_of(), outcome_of()])

    monkeypatch.setattr(testbed.cli, "run_repeated", fake)
    assert main(["run", "dctcp", "--repeat", "2", "--quiet"]) == EXIT_OK
    assert asked == [("dctcp", 2)]
    out = capsys.readouterr().out
    assert "PASSED: 2 of 2 runs passed" in out and "Runs" in out
    assert main(["dctcp", "--repeat", "2", "--quiet"]) == EXIT_OK  # experiment commands too
    assert asked[-1] == ("dctcp", 2)


def test_run_repeat_zero_is_bad_input(capsys, monkeypatch):
    def no_run(*args, **kwargs):
        pytest.fail("nothing may run")

    monkeypatch.setattr(testbed.harness.repeat, "run_scenario", no_run)
    assert main(["run", "dctcp", "--repeat", "0"]) == EXIT_USAGE
    assert "repeat: must be a whole number of runs" in capsys.readouterr().err


def test_a_repeat_that_did_not_pass_exits_1(monkeypatch, tmp_path):
    runs = [run_summary(run_id="r1", trust=UNTRUSTED)]

    def fake(resolved, repeat, log=print, progress=None):
        return RepeatOutcome(repeat_summary(runs, folder=tmp_path), tmp_path,
                             [outcome_of(trust=[at_most("cpu", 1, 0.9, "")])])

    monkeypatch.setattr(testbed.cli, "run_repeated", fake)
    assert main(["run", "dctcp", "--repeat", "1", "--quiet"]) == EXIT_VERDICT
    assert main(["run", "dctcp", "--repeat", "1", "--quiet", "--accept-untrusted"]) == EXIT_OK
