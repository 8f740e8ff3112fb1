"""``testbed lab`` end to end with the runs stood in for (the harness's run of a scenario
replaced by synthetic summaries of the real structure, the walkthrough's replay by canned
output): list, run (one lab and all of them, with the index page), check (the latest run, a
lab run folder, run folders by hand) and their exit statuses; nothing builds a network."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import testbed.apply.network
import testbed.apply.state
import testbed.lab.runner as runner
from testbed.cli import main
from testbed.harness.report import write_report
from testbed.lab.runner import LabRun, latest_run
from testbed.lab.spec import find_lab
from testbed.lab.walkthrough import StepRun
from tests.unit.lab.synthetic import RESULTS, resolved_run, summary_of


def write_run(folder: Path, summary: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    write_report(summary, folder)
    return folder


def synthetic_run(lab, run, short: bool, folder: Path, trusted: bool = True) -> Path:
    resolved = resolved_run(lab, run, short)
    summary = summary_of(resolved, RESULTS[resolved.experiment.name](resolved, folder / "raw"),
                         trusted)
    return write_run(folder / f"20260101-000000-{resolved.scenario.name}-0000", summary)


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """Runs without a network: each scenario's run folder written from synthetic results,
    the walkthrough's replay printing nothing."""
    ran = []

    def run_one(lab, run, results, short, log, overrides):
        ran.append((lab.number, run.name, short))
        return str(synthetic_run(lab, run, short, results)), ""

    monkeypatch.setattr(runner, "run_one", run_one)
    monkeypatch.setattr(runner, "replay", lambda steps, cwd, log: [
        StepRun(s.text, "", None if s.prompt else 0) for s in steps])
    monkeypatch.setattr(testbed.apply.network, "check_root", lambda: None)
    monkeypatch.setattr(testbed.apply.state, "RunLock", FreeMachine)
    return ran


class FreeMachine:
    """The machine's run lock stood in for: these tests never take the real one."""

    def __init__(self, run_id: str):
        self.run_id = run_id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_list_names_every_lab_and_what_it_runs(capsys):
    assert main(["lab", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"^00 +A walkthrough of a live fabric", lines[2])
    assert [line[:2] for line in lines[2:]] == [f"{n:02d}" for n in range(17)]
    out = "\n".join(lines)
    assert "hedera.yaml" in out and "walkthrough.checks.yaml" in out


def test_bad_input_is_one_line_and_status_2(capsys, tmp_path):
    assert main(["lab", "check", "99"]) == 2
    assert "no lab 99" in capsys.readouterr().err
    assert main(["lab", "check", "seven"]) == 2
    assert main(["lab", "check", "16", "--results", str(tmp_path)]) == 2
    assert "no run under" in capsys.readouterr().err


def test_run_one_lab_then_check_it_again(stand_ins, tmp_path, capsys):
    assert main(["lab", "run", "16", "--short", "--results", str(tmp_path)]) == 0
    assert stand_ins == [(16, "pipeline", True)]
    record = latest_run(tmp_path, find_lab(16))
    assert record.form == "short" and list(record.runs) == ["pipeline"]
    check = json.loads((record.folder / "self-check.json").read_text())
    assert check["passed"] and check["counts"]["PASS"] == 5
    assert (record.folder / "self-check.html").read_text().count('<a href="pipeline/') == 1
    capsys.readouterr()
    assert main(["lab", "check", "16", "--results", str(tmp_path)]) == 0
    assert "lab 16-pipeline-parallel: PASSED: 5 of 5 items passed" in capsys.readouterr().out
    assert main(["lab", "check", "16", str(record.folder)]) == 0
    assert main(["lab", "check", "15", str(record.folder)]) == 2
    assert "a run of lab 16-pipeline-parallel, not of lab 15-tensor-parallel" in \
        capsys.readouterr().err


def test_check_run_folders_given_by_hand(tmp_path, capsys):
    lab = find_lab(11)
    ring, hierarchical = (synthetic_run(lab, run, False, tmp_path / run.name)
                          for run in lab.manifest.runs)
    assert main(["lab", "check", "11", str(ring), str(hierarchical)]) == 0
    assert main(["lab", "check", "11", str(ring)]) == 1  # the hierarchical run's items: not run
    assert "no summary of run hierarchical" in capsys.readouterr().out
    assert main(["lab", "check", "3", str(ring)]) == 2
    assert "a run of scenario 'lab11-nvswitch-ring', not one of lab 3's" in \
        capsys.readouterr().err


def test_an_untrusted_run_does_not_pass(tmp_path, capsys):
    lab = find_lab(5)
    folder = synthetic_run(lab, lab.manifest.runs[0], False, tmp_path, trusted=False)
    assert main(["lab", "check", "5", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "not judged" in out and "PASS " not in out


def test_the_latest_lab_run_is_the_newest_folder(tmp_path):
    lab = find_lab(5)
    for stamp in ("20260102-000000-lab05-aaaa", "20260101-000000-lab05-bbbb"):
        folder = runner.lab_results(tmp_path, lab) / stamp
        folder.mkdir(parents=True)
        LabRun(folder, lab.name, "full", {"failover": "x"}).save()
    (runner.lab_results(tmp_path, lab) / "20270101-not-a-run").mkdir()
    assert latest_run(tmp_path, lab).folder.name == "20260102-000000-lab05-aaaa"
    with pytest.raises(Exception, match="not a lab run folder"):
        LabRun.load(tmp_path)


def test_run_all_runs_every_lab_and_writes_the_index(stand_ins, tmp_path, capsys):
    status = main(["lab", "run", "all", "--short", "--results", str(tmp_path)])
    assert status == 1  # the walkthrough's stand-in replay printed nothing: it fails
    assert sorted({n for n, _, _ in stand_ins}) == list(range(1, 17))
    index = (tmp_path / "labs" / "index.md").read_text()
    assert "16 of 17 labs passed their self-check" in index
    assert index.count("[PASSED (") == 16 and index.count("[NOT PASSED (") == 1
    page = (tmp_path / "labs" / "index.html").read_text()
    assert page.count("self-check.html") == 17 and "transcript.md" in page
    for href in [part.split('"')[0] for part in page.split('href="')[1:]]:
        assert (tmp_path / "labs" / href).is_file(), href
    assert main(["lab", "index", "--results", str(tmp_path)]) == 0
