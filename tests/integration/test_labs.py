"""Every lab's self-check on its shortened form (what `make lab LAB_SHORT=1` runs): each lab's
scenarios run through the harness as `testbed lab run N --short` runs them, and every item of
its check.yaml must pass on trusted runs. About 12 minutes for the sixteen labs on a 2-CPU
machine (estimated from the bundled scenarios' measured runs; the lead's run replaces it).
Needs root; runs alone; lab 00 is tests/integration/test_lab_walkthrough.py."""
from __future__ import annotations

import pytest
from tests.integration.conftest import assert_clean

from testbed.harness.console import table_text
from testbed.lab.runner import check_lab_run, run_lab
from testbed.lab.spec import all_labs
from testbed.model.verdict import PASS

LABS = [lab for lab in all_labs() if lab.checks is not None]


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_the_shortened_lab_passes_its_self_check(lab, tmp_path):
    record = run_lab(lab, tmp_path, short=True)
    check = check_lab_run(lab, record)
    print(table_text(check.rows()[1:], check.rows()[0]))
    assert record.errors == {}
    assert [(i.name, i.outcome, i.measured, i.reason) for i in check.items
            if i.outcome != PASS] == []
    assert check.passed
    assert_clean()
