"""Every lab's self-check against synthetic summaries with the structure real ones have
(tests/unit/lab/synthetic.py: the experiments' own checks on results as their ``measure``
returns them): a run that meets every claim passes every item, in both forms; a run that
breaks every claim fails every item; an untrusted run judges none. And every lab scenario
loads, in both forms, at a fixed link rate no higher than the bundled scenarios' own."""
from __future__ import annotations

import fnmatch

import pytest

from testbed.lab.judge import NOT_JUDGED, judge
from testbed.lab.spec import all_labs
from testbed.lab.values import FILTER, INDEX, lookup, parse_path, split_run
from testbed.model.verdict import FAIL, PASS
from tests.unit.lab.synthetic import VIOLATIONS, resolved_run, summaries

LABS = all_labs()
CHECKED = [lab for lab in LABS if lab.checks is not None]
# The highest rate a bundled scenario runs at, held trusted on 2-CPU machines (dctcp,
# roce-*, pfc-demo); labs run at it or lower, never at a machine's calibrated rate.
MAX_LAB_RATE_MBIT = 20.0


def lab_id(lab) -> str:
    return lab.name


def fail_checks(summary: dict, name: str, setup: str | None) -> None:
    """Every check of the run's verdict that an item names, failed."""
    pattern = any(ch in name for ch in "*?[")
    for check in summary["verdict"]["checks"]:
        if (fnmatch.fnmatchcase(check["name"], name) if pattern else check["name"] == name) \
                and (setup is None or check["setup"] == setup):
            check.update(passed=False, outcome=FAIL)


def assign(data, path: str, value) -> None:
    """Write ``value`` at ``path`` (the last step a key or a position)."""
    *steps, last = parse_path(path)
    target = data
    for step in steps:
        if step.kind == FILTER:
            target = [item for item in target if all(str(item.get(f)) == w
                                                     for f, w in step.match)]
        else:
            target = target[step.index if step.kind == INDEX else step.key]
    target[last.index if last.kind == INDEX else last.key] = value


def value_paths(lab) -> set[tuple[str, str]]:
    """(run, path) of every value the lab's items read."""
    read = set()
    for item in lab.checks.items:
        for condition in item.conditions:
            for path in condition.names.values():
                run, _ = split_run(path)
                read.add((run or lab.run_for(item).name, path.split(":", 1)[1] if run else path))
    return read


def test_every_lab_is_there_in_order():
    assert [lab.number for lab in LABS] == list(range(17))
    assert LABS[0].manifest.replay and all(lab.manifest.runs for lab in LABS[1:])


@pytest.mark.parametrize("short", [False, True], ids=["full", "short"])
@pytest.mark.parametrize("lab", CHECKED, ids=lab_id)
def test_a_run_that_meets_every_claim_passes_every_item(lab, short, tmp_path):
    check = judge(lab, summaries(lab, short, tmp_path))
    assert [(i.name, i.outcome, i.reason) for i in check.items if i.outcome != PASS] == []
    assert check.passed and len(check.items) >= 3


@pytest.mark.parametrize("lab", CHECKED, ids=lab_id)
def test_a_run_that_breaks_every_claim_fails_every_item(lab, tmp_path):
    found = summaries(lab, False, tmp_path)
    for item in lab.checks.items:
        for condition in item.conditions:
            if condition.check is not None:
                fail_checks(found[lab.run_for(item).name], condition.check, condition.setup)
    for run, paths in VIOLATIONS.get(lab.number, {}).items():
        for path, value in paths.items():
            assign(found[run], path, value)
    check = judge(lab, found)
    assert [(i.name, i.outcome, i.measured) for i in check.items if i.outcome != FAIL] == []
    assert not check.passed


@pytest.mark.parametrize("lab", CHECKED, ids=lab_id)
def test_the_violations_touch_only_what_the_items_read(lab, tmp_path):
    found = summaries(lab, False, tmp_path)
    written = {(run, path) for run, paths in VIOLATIONS.get(lab.number, {}).items()
               for path in paths}
    assert written <= value_paths(lab)
    for run, path in written:
        lookup(found[run], path)  # there, in a summary of the real structure


@pytest.mark.parametrize("lab", CHECKED, ids=lab_id)
def test_an_untrusted_run_judges_no_item(lab, tmp_path):
    check = judge(lab, summaries(lab, False, tmp_path, trusted=False))
    assert {i.outcome for i in check.items} == {NOT_JUDGED}
    assert all("did not keep up" in i.reason and "would be PASS" in i.reason
               for i in check.items)
    assert not check.passed


@pytest.mark.parametrize("short", [False, True], ids=["full", "short"])
@pytest.mark.parametrize("lab", CHECKED, ids=lab_id)
def test_every_scenario_loads_at_a_fixed_rate(lab, short):
    for run in lab.manifest.runs:
        experiment = resolved_run(lab, run, short).experiment
        assert experiment.rate_decision[1] == "set by the scenario", run.scenario
        assert experiment.rate_mbit <= MAX_LAB_RATE_MBIT, run.scenario
