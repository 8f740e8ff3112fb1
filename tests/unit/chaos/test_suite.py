"""The suite's thin layer (testbed.chaos.suite) around a stand-in testbed that walks the
ledger's phases (fake_testbed.py) in a temporary state folder: a SIGKILL lands in the phase
the ledger names, at its planned share of that phase; a killed run is followed by `testbed
clean` and a plain run; a run past its time is ended as hung; the run lock is held for the
concurrent-run row; every run is judged and the summary written. No root, nothing mounted,
the machine's snapshot a stand-in."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import testbed.apply.state as state
import testbed.chaos.suite as suite
from testbed.chaos.leftovers import Snapshot
from testbed.chaos.plan import PROFILES, SuitePlan, Trial, WORKLOADS
from testbed.chaos.suite import Suite, kill_time, phase_durations, run_process
from testbed.chaos.table import (
    BASELINE,
    FAILED_LOUDLY,
    LOCK_HELD,
    PASSES,
    RECOVERED,
    REFUSED,
    SURVIVED,
)

FAKE = [sys.executable, str(Path(__file__).with_name("fake_testbed.py"))]
PHASE_S = 0.3


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """The state folder in ``tmp_path``, the stand-in testbed, an unchanging machine."""
    folder = tmp_path / "state"
    monkeypatch.setenv("TESTBED_STATE_DIR", str(folder))
    monkeypatch.setenv("FAKE_PHASE_S", str(PHASE_S))
    monkeypatch.setattr(state, "STATE_DIR", folder)
    monkeypatch.setattr(state, "LOCK_PATH", folder / "lock")
    monkeypatch.setattr(state, "LEDGER_PATH", folder / "state.json")
    monkeypatch.setattr(suite, "TESTBED", FAKE)
    monkeypatch.setattr(suite.machine_state, "snapshot", lambda: Snapshot())
    return tmp_path


def test_phase_durations_and_kill_times():
    assert phase_durations([("bring-up", 10.0), ("workload", 12.5), ("tear-down", 20.0)],
                           21.0) == {"bring-up": 2.5, "workload": 7.5, "tear-down": 1.0}
    assert phase_durations([("bring-up", 1.0), ("workload", 2.0), ("bring-up", 3.0),
                            ("workload", 4.0)], None) == {"bring-up": 2.0, "workload": 1.0}
    assert kill_time(100.0, 0.25, 8.0) == 102.0


@pytest.mark.parametrize("phase", ["bring-up", "workload", "tear-down"])
def test_a_sigkill_lands_in_the_phase_the_ledger_names(fake_machine, tmp_path, phase):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: chaos-plain-run\n")
    run = run_process([*FAKE, "run", str(scenario), "--results", str(tmp_path / "r")], tmp_path,
                      "run", {}, 30.0, kill=(phase, 0.5, PHASE_S))
    assert run.exit_status is None and run.landed == phase
    start = dict(run.transitions)[phase]
    assert run.elapsed_s < 3 * PHASE_S + 2  # it did not run to its end
    assert state.Ledger.load().phase == phase  # the killed run's ledger is left for clean
    assert start + 0.5 * PHASE_S <= time.monotonic()


def test_a_run_past_its_time_is_ended_as_hung(fake_machine, tmp_path):
    t0 = time.monotonic()
    run = run_process([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, "run",
                      {}, hang_s=0.5)
    assert run.hung and run.exit_status is None and time.monotonic() - t0 < 30


def trial(index, fault, expected, **more) -> Trial:
    return Trial(index, fault, "small", 1, expected, settings=dict(WORKLOADS["small"].settings),
                 within_s=60.0, **more)


def test_a_suite_runs_judges_and_writes_every_run(fake_machine, tmp_path):
    plan = SuitePlan(7, PROFILES["ci"], (
        trial(0, BASELINE, PASSES),
        trial(1, "link-flap", SURVIVED, failures=({"at_s": 1.0, "for_s": 1.0,
                                                   "action": "link_down",
                                                   "links": {"role": "aggregation"},
                                                   "mode": "one"},)),
        trial(2, "rank-kill", FAILED_LOUDLY),
        trial(3, "concurrent-run", REFUSED, setup=LOCK_HELD),
        trial(4, "sigkill-workload", RECOVERED, kill_phase="workload", kill_fraction=0.5),
        trial(5, "sigkill-workload", RECOVERED, kill_phase="workload", kill_fraction=0.5,
              spare=True),  # the first kill landed: not needed, not run
    ))
    lines = []
    summary = Suite(plan, tmp_path / "suite", lines.append).run()
    trials = {t["name"]: t for t in summary["trials"]}
    assert list(trials) == ["00-plain-run", "01-link-flap", "02-rank-kill", "03-concurrent-run",
                            "04-sigkill-workload"]
    assert all(t["held"] for t in trials.values()), [t["reasons"] for t in trials.values()]
    assert trials["02-rank-kill"]["error_line"] == (
        "testbed: error: AllReduce iterations: rank 3 died: killed by SIGKILL")
    kill = trials["04-sigkill-workload"]
    assert (kill["landed"], kill["clean_status"], kill["next_run"]["exit_status"]) == (
        "workload", 0, 0)
    assert summary["usual_phase_s"]["workload"] == pytest.approx(PHASE_S, abs=0.2)
    assert summary["counts"]["faults_injected"] == 4 and summary["counts"]["as_expected"] == 4
    assert summary["kills"] == {"bring-up": 0, "workload": 1, "tear-down": 0}
    assert not summary["passed"]  # a partial plan: rows and phases missing
    assert "rows never run: controller-restart" in "; ".join(summary["reasons"])
    written = json.loads((tmp_path / "suite" / "summary.json").read_text())
    assert written["seed"] == 7 and written["command"] == "testbed chaos --profile ci --seed 7"
    folder = tmp_path / "suite" / "trials" / "04-sigkill-workload"
    assert (folder / "scenario.yaml").exists() and (folder / "clean.out").exists()
    assert (folder / "next" / "results" / "fake-run" / "summary.json").exists()
    assert any(line.startswith("01-link-flap: exit 0") and line.endswith("as expected")
               for line in lines)
    assert not state.LEDGER_PATH.exists()


def test_a_suite_whose_first_plain_run_fails_injects_nothing(fake_machine, tmp_path):
    from testbed.errors import TestbedError

    plan = SuitePlan(7, PROFILES["ci"], (
        Trial(0, "rank-kill", "small", 1, PASSES, within_s=60.0),  # a plain run that fails
        trial(1, "link-flap", SURVIVED)))
    with pytest.raises(TestbedError, match="the plain run before any fault did not pass"):
        Suite(plan, tmp_path / "suite", lambda m: None).run()
    written = json.loads((tmp_path / "suite" / "summary.json").read_text())
    assert written["stopped"] == "the plain run failed" and len(written["trials"]) == 1
