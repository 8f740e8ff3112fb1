"""`testbed run --repeat` end to end on real fabrics: a short ring twice, each run on a fabric
of its own, one summary with every number's spread; `testbed report --require-pass` gating on
the repeat and its runs; and the repeat's and a run's report.html opened in headless Chromium
(every image loaded, every caption and section there; screenshots kept in pytest's tmp folder
or TESTBED_TEST_ARTEFACTS)."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import REPO, assert_clean
from tests.integration.test_run_lifecycle import SMALL_RUN
from tests.unit.browser import check_report_in_browser

from testbed.harness.summary_schema import read_summary

TESTBED = [sys.executable, "-m", "testbed"]
RUNS = 2
TIMEOUT_S = 900


def test_a_repeated_run_reports_every_number_with_its_spread(tmp_path):
    results = tmp_path / "results"
    out = subprocess.run([*TESTBED, *SMALL_RUN, "--repeat", str(RUNS), "--results",
                          str(results)], cwd=REPO, capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    (folder,) = results.iterdir()
    summary = read_summary(folder)
    passed = summary["verdict"]["passed"]
    assert out.returncode == (0 if passed else 1), out.stdout + out.stderr
    assert summary["kind"] == "repeat" and summary["status"] == "complete"
    lines = out.stdout.splitlines()
    assert "[testbed] run 1/2" in lines  # progress before each run
    assert any(line.startswith("[testbed] run 2/2 (about ") for line in lines)
    runs = [folder / r["dir"] for r in summary["runs"]]
    assert len(runs) == RUNS and all((run / "summary.json").exists() for run in runs)
    fabrics = [json.loads((run / "fabric.json").read_text()) for run in runs]
    assert fabrics[0] == fabrics[1]  # the same fabric, built afresh for each run
    busbw = next(row for row in summary["rows"] if row["what"] == "busbw")
    for number in busbw["numbers"]:
        assert number["n"] == RUNS and number["min"] <= number["median"] <= number["max"]
    check = next(c for c in summary["checks"] if c["name"] == "busbw / link rate")
    assert len(check["outcomes"]) == RUNS and check["measured"]["n"] == RUNS
    assert (folder / "plots" / "spread.png").exists()

    gate = subprocess.run([*TESTBED, "report", str(folder), *map(str, runs), "--require-pass"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert gate.returncode == (0 if passed else 1), gate.stdout + gate.stderr
    assert ("not passed:" in gate.stdout) == (not passed)

    check_report_in_browser(folder, tmp_path)
    check_report_in_browser(runs[0], tmp_path)
    assert_clean()
