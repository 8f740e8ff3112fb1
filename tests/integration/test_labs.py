"""Every lab's self-check on its shortened form (what `make lab LAB_SHORT=1` runs): each lab's
scenarios run through the harness as `testbed lab run N --short` runs them, and every item of
its check.yaml must pass on trusted runs. A lab whose only shortfall is an untrusted run
(items "not judged": the emulator, not the fabric, set a number) is taken once more, as a
student would rerun it; a second untrusted take, or any FAIL, fails the test. Needs root;
runs alone; lab 00 is tests/integration/test_lab_walkthrough.py."""
from __future__ import annotations

import pytest
from tests.integration.conftest import assert_clean

from testbed.harness.console import table_text
from testbed.lab.judge import NOT_JUDGED
from testbed.lab.runner import check_lab_run, run_lab
from testbed.lab.spec import all_labs
from testbed.model.verdict import PASS

LABS = [lab for lab in all_labs() if lab.checks is not None]
TAKES = 2  # an untrusted take is void and taken again once


def take(lab, tmp_path):
    """The lab's shortened runs and their self-check, taken again while the only items short
    of PASS are not judged (an untrusted run), at most ``TAKES`` times."""
    for number in range(1, TAKES + 1):
        record = run_lab(lab, tmp_path / f"take{number}", short=True)
        check = check_lab_run(lab, record)
        print(table_text(check.rows()[1:], check.rows()[0]))
        short = [i for i in check.items if i.outcome != PASS]
        if record.errors or not short or any(i.outcome != NOT_JUDGED for i in short):
            break
        reasons = sorted({i.reason for i in short})
        print(f"take {number} of {TAKES} not trusted: " + "; ".join(reasons))
    return record, check


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_the_shortened_lab_passes_its_self_check(lab, tmp_path):
    record, check = take(lab, tmp_path)
    assert record.errors == {}
    assert [(i.name, i.outcome, i.measured, i.reason) for i in check.items
            if i.outcome != PASS] == []
    assert check.passed
    assert_clean()
