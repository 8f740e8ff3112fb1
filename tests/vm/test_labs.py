"""Labs on the stock kernel (make vm-test): lab 00's page replayed, and the self-checks of
labs 05 (anycast), 09 (its DCTCP run: RED marking and dctcp hosts) and 13 (the parameter
server's incast on a k=4 fat-tree), on the OVS kernel datapath. (Lab 16's pipeline judges
its bubbles by timing alone, which software emulation distorts: its 1F1B bubble read 0.111
against 0.1 in a trusted guest run, and the kernel datapath it would add is covered here
already.) Under software emulation a run may not be trusted; its items are then not judged,
and the test skips with the verdict's reasons (allowed-skips.txt lists these tests for that
alone). The functional parts never skip: the replay, the runs completing on the kernel's
paths, every rank's and stage's data verified. Runs only in the stock-kernel guest."""
from __future__ import annotations

import pytest

from testbed.harness.console import table_text
from testbed.lab.judge import judge, run_doubt
from testbed.lab.runner import check_lab_run, run_lab, summaries_of
from testbed.lab.spec import find_lab
from testbed.model.verdict import PASS

CLEAN = {"veths": [], "taps": [], "bridges": [], "processes": [], "netns": []}
# The runs each lab's test makes, and what it sets on top of the shortened form: the lowest
# rates that keep each lab's claim (the lead sets them from what the guest measured).
# Lab 13's k=4 fat-tree runs at 2 Mbit/s, as the guest's other fat-tree run keeps its rate low.
RUNS = {5: ("failover", {}), 9: ("dctcp", {"link_rate_mbit": 10}),
        13: ("ps", {"link_rate_mbit": 2})}
# The path each lab's run must take on a stock kernel (provenance.paths in summary.json).
STOCK_PATHS = {"ovs_datapath": "kernel", "ecn_marking": "red-qdisc"}


def test_the_walkthrough_replays_on_the_kernel_datapath(tmp_path, leftovers):
    lab = find_lab(0)
    check = check_lab_run(lab, run_lab(lab, tmp_path))
    print(table_text(check.rows()[1:], check.rows()[0]))
    assert [(i.name, i.reason) for i in check.items if i.outcome != PASS] == []
    assert leftovers() == CLEAN


@pytest.mark.parametrize("number", sorted(RUNS))
def test_a_labs_self_check_on_the_stock_kernel(number, tmp_path, leftovers):
    lab = find_lab(number)
    run, overrides = RUNS[number]
    record = run_lab(lab, tmp_path, short=True, only={run}, overrides=overrides)
    assert record.errors == {} and list(record.runs) == [run]
    summary = summaries_of(record)[run]
    assert summary["status"] == "complete", summary.get("error")
    paths = summary["provenance"]["paths"]
    assert {k: paths[k] for k in STOCK_PATHS} == STOCK_PATHS
    verified = [c for c in summary["verdict"]["checks"] if "verified" in c["name"]]
    assert all(c["passed"] for c in verified), verified
    assert leftovers() == CLEAN
    check = judge(lab, {run: summary}, record.runs)
    items = [i for i in check.items if i.run == run]
    print(table_text([r for r in check.rows()[1:] if r[2] == run], check.rows()[0]))
    doubt = run_doubt(summary)
    if doubt:
        pytest.skip(f"lab {lab.name}: {doubt}")
    assert [(i.name, i.outcome, i.measured, i.reason) for i in items
            if i.outcome != PASS] == []
