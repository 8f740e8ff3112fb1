"""The suite's printed table and lines (testbed.chaos.report), and the ``testbed chaos``
command's seed, plan and input errors (no root: nothing runs)."""
from __future__ import annotations

import os

import pytest

import testbed.apply.state as state
import testbed.chaos.command
from testbed.chaos.plan import PROFILES, plan_suite
from testbed.chaos.report import HEADER, plan_rows, report_lines, report_rows
from testbed.cli import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, main


def summary(passed: bool) -> dict:
    return {
        "seed": 7, "profile": "ci", "wall_s": 540.0, "budget_s": 600,
        "command": "testbed chaos --profile ci --seed 7", "passed": passed,
        "reasons": [] if passed else ["1 runs did not have their expected outcome"],
        "kills_per_phase": 1, "kills": {"bring-up": 1, "workload": 2, "tear-down": 1},
        "counts": {"faults_injected": 13, "as_expected": 12 + passed, "wrongly_verified": 0,
                   "leftovers": 0, "survived_verified": 3},
        "rows": [{"fault": "rank-kill", "expected": "failed loudly", "runs": 1,
                  "held": int(passed), "observed": "exit 3 x1", "wrongly_verified": 0,
                  "leftovers": 0}],
        "trials": [{"name": "05-rank-kill", "held": passed, "observed": "exit 0 after 40 s",
                    "reasons": [] if passed else ["exit 0, not 3"]}],
    }


def test_the_table_has_a_row_per_fault():
    assert report_rows(summary(True)) == [
        HEADER, ["rank-kill", "failed loudly", "1", "1/1", "exit 3 x1", "0", "0"]]


def test_the_lines_give_the_kills_the_totals_the_seed_and_the_verdict():
    lines = report_lines(summary(True))
    assert lines[0] == "SIGKILLs landed: bring-up 1, workload 2, tear-down 1 (1 needed in each)"
    assert lines[1] == ("faults injected 13, as expected 13, wrongly reported verified 0, "
                        "things left behind 0, survivable faults with data verified 3")
    assert lines[2] == ("seed 7, profile ci: 9.0 of 10 minutes (repeat: testbed chaos "
                        "--profile ci --seed 7)")
    assert lines[-1] == "PASSED: every run had its expected outcome"
    failed = report_lines(summary(False))
    assert "  05-rank-kill: exit 0 after 40 s: exit 0, not 3" in failed
    assert failed[-1] == "FAILED: 1 runs did not have their expected outcome"


def test_a_plan_is_shown_run_by_run():
    rows = plan_rows(plan_suite(PROFILES["ci"], 7))
    assert rows[0] == ["run", "workload", "expected", "fault", "estimate"]
    assert rows[1][:3] == ["00-plain-run", "small", "passes"]
    assert any(r[3].startswith("SIGKILL at ") and r[3].endswith("(spare)") for r in rows)
    assert any("action: kill, daemon: ovs-vswitchd" in r[3] for r in rows)


def test_the_command_prints_its_seed_and_plan_without_root(capsys):
    assert main(["chaos", "--profile", "ci", "--seed", "7", "--plan"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("[chaos] seed 7 (repeat with --seed 7); profile ci: ")
    assert "00-plain-run" in out and "sigkill-tear-down" in out
    assert main(["chaos", "--plan"]) == EXIT_OK  # a new seed, printed
    assert "(repeat with --seed " in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "words"), [
    (["chaos", "--seed", "-1", "--plan"], "--seed: must be in [0, 2147483647], got -1"),
    (["chaos", "--profile", "nightly"], "invalid choice: 'nightly'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    if argv[1] == "--profile":
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == EXIT_USAGE
    else:
        assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_the_suite_needs_root_and_a_machine_without_an_earlier_runs_ledger(
        capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["chaos", "--profile", "ci", "--seed", "1", "--results", str(tmp_path)]) == \
        EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("testbed: error: this needs root") and err.count("\n") == 1
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(testbed.chaos.command, "check_can_build", lambda: None)
    monkeypatch.setattr(state, "LEDGER_PATH", tmp_path / "state.json")
    (tmp_path / "state.json").write_text('{"run_id": "killed-run", "owner_pid": 1}')
    assert main(["chaos", "--profile", "ci", "--seed", "1", "--results", str(tmp_path)]) == \
        EXIT_RUN_FAILED
    assert "run `testbed clean` first" in capsys.readouterr().err
    assert not list(tmp_path.glob("chaos-*"))  # nothing made
