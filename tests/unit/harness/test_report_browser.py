"""report.html as a reader sees it: opened in headless Chromium (tests/unit/browser.py), every
image loads, every figure has its caption and every section is there; the screenshot is
kept (in pytest's tmp folder, or TESTBED_TEST_ARTEFACTS). The pages are a run folder drawn
by the harness's own plotting code, a repeated run made around the stand-in network, and
the run folders named in TESTBED_REPORT_RUN (paths separated by ':'), e.g. a real run's:

    TESTBED_REPORT_RUN=results/RUN_ID .venv/bin/python -m pytest \\
        tests/unit/harness/test_report_browser.py
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.unit.browser import check_report_in_browser, open_report
from tests.unit.report_folders import synthetic_run
from tests.unit.stand_ins import StandInExperiment, standins  # noqa: F401 (a fixture)

from testbed.capabilities import detect
from testbed.harness.experiment import Resolved
from testbed.harness.repeat import run_repeated
from testbed.harness.scenario import Scenario

GIVEN_ENV = "TESTBED_REPORT_RUN"
GIVEN = [Path(p) for p in os.environ.get(GIVEN_ENV, "").split(os.pathsep) if p]


def test_a_drawn_runs_report_shows_every_image_caption_and_section(tmp_path):
    folder = synthetic_run(tmp_path / "20261201-000000-fattree-allreduce-ab12")
    check_report_in_browser(folder, tmp_path)


def test_a_repeated_runs_report_shows_every_image_caption_and_section(tmp_path, standins):
    scenario = Scenario(name="standin-run", experiment="standin", link_rate_mbit=6.0,
                        results_dir=str(tmp_path / "results"))
    platform = detect()
    experiment = StandInExperiment(scenario, StandInExperiment.Params(), platform)
    resolved = Resolved(scenario, experiment, platform, experiment.setups(), None)
    outcome = run_repeated(resolved, 2, log=lambda m: None)
    check_report_in_browser(outcome.workdir, tmp_path)
    for run in outcome.outcomes:  # each run's own report, with its topology figure
        check_report_in_browser(run.workdir, tmp_path)


if GIVEN:  # defined only when folders are given: no test stands skipped otherwise
    @pytest.mark.parametrize("run_dir", GIVEN, ids=str)
    def test_a_given_runs_report_shows_every_image_caption_and_section(run_dir, tmp_path):
        check_report_in_browser(run_dir, tmp_path)


def test_a_broken_image_is_seen(tmp_path):
    """The browser check fails on what it is for: an image that does not load."""
    page = tmp_path / "report.html"
    page.write_text("<!doctype html><html><body><section><h2>Plots</h2><figure>"
                    '<img alt="plots/x.png" src="data:image/png;base64,bm90IGEgcG5n">'
                    "<figcaption>x</figcaption></figure></section></body></html>")
    found = open_report(page, tmp_path / "shot.png", tmp_path)
    assert found["broken"] == ["plots/x.png"] and found["sections"] == ["Plots"]
