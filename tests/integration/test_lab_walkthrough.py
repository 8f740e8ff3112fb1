"""Lab 00's page, replayed on this machine: every command of labs/00-walkthrough/README.md
(testbed up, the prompt's pingall, flows, groups, a cut cable and the reroute, an iperf flow,
a capture, exec, tshark, testbed down) runs as the page shows it, and each output has the
shape walkthrough.checks.yaml asks for; the fabric is down and nothing is left afterwards.
Needs root; runs alone."""
from __future__ import annotations

from tests.integration.conftest import assert_clean

from testbed.harness.console import table_text
from testbed.lab.runner import TRANSCRIPT, check_lab_run, run_lab
from testbed.lab.spec import find_lab
from testbed.model.verdict import PASS


def test_the_walkthrough_replays_as_its_page_shows(tmp_path):
    lab = find_lab(0)
    record = run_lab(lab, tmp_path)
    check = check_lab_run(lab, record)
    print((record.folder / TRANSCRIPT).read_text())
    print(table_text(check.rows()[1:], check.rows()[0]))
    assert [(i.name, i.reason) for i in check.items if i.outcome != PASS] == []
    assert check.passed
    assert_clean()
