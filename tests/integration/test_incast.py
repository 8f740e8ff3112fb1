"""Incast on the wire, as ``scenarios/incast.yaml`` runs it but shortened: fan-in 15 only and
10 recorded queries of 16 KiB responses, each mode (drop-tail, ECN, PFC) on a k=4 fat-tree of its own at 10 Mbit/s
with the default 62.5 KB buffer per port, all traffic in the lossless class.

The run's own checks hold incast's expectations (testbed.experiments.incast.checks): drop-tail
drops and waits for retransmission timeouts, ECN marks and times out less, PFC drops nothing
in the lossless class or at any switch queue and pauses instead, ECN's and PFC's p99 query
completion at least 10% below drop-tail's, and every query completed; each mode's run must
have been trustworthy (CPU headroom, packet conservation, the pause agent alive). Needs root;
runs alone."""
from __future__ import annotations

from testbed.experiments.incast.checks import MODES
from testbed.experiments.incast.experiment import summary_cell
from testbed.harness.run import run_scenario
from testbed.experiments.registry import load

FANIN = 15
ROUNDS = 20  # as the scenario: with 10, drop-tail once had a single RTO and ECN one too
CHECKS_PER_RUN = 12  # 3 completions, 2 drop-tail, 2 ECN, 3 PFC, 2 tails


def test_incast_at_fan_in_15_under_every_queue_mode(tmp_path):
    resolved = load("incast", {"results_dir": str(tmp_path), "params.fanins": [FANIN],
                               "params.rounds": ROUNDS})
    outcome = run_scenario(resolved, log=print)
    results = outcome.summary["results"]
    assert list(results) == list(MODES)
    for mode in MODES:
        [summary] = results[mode]["summaries"]
        print(f"{mode}: {summary_cell(summary)}")
    checks = outcome.verdict.checks
    for check in checks:
        print(f"{check.outcome} {check.setup} {check.name}: {check.statement}")
    assert len(checks) == CHECKS_PER_RUN
    assert [c for c in checks if c.outcome != "PASS"] == []
    assert outcome.verdict.emulator_trusted, outcome.verdict.reasons
    assert outcome.exit_status() == 0
    assert (outcome.workdir / "plots" / "incast.png").exists()
    assert (outcome.workdir / "report.md").exists()
