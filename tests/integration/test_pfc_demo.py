"""PFC's costs on the wire, as ``scenarios/pfc-demo.yaml`` runs them but with the victim 3 s
alone (15 s beside the incast: with 5 s the pauses had not yet spread, and the victim under
PFC kept 70% of its lossy rate in one run): on the k=4 fat-tree at 20 Mbit/s, a 13:1 incast
in the lossless class, and a victim flow that never uses the congested port but shares the
links that feed it, under lossy queues, PFC, and PFC with ECN.
The run's own checks (testbed.experiments.pfc.checks) hold each demonstration to its
tolerance: under PFC the victim gets at most half its lossy rate (head-of-line blocking),
ports two or more hops from the congested switch are paused (spreading), ECN at most halves
the port-seconds paused, and neither PFC run drops in the lossless class; every run must
have been trustworthy (CPU headroom, packet conservation, the receiver's link delivering
its rate, the pause agent alive). Measured with 15 s: the victim under PFC at 0.14 and 0.25
of its lossy rate in two runs. Needs root; runs alone."""
from __future__ import annotations

from testbed.experiments.pfc_demo.checks import CONDITIONS, LOSSY, PFC, PFC_ECN
from testbed.harness.run import run_scenario
from testbed.experiments.registry import load

CHECKS_PER_RUN = 5  # head-of-line blocking, spreading, ECN's cut, lossless in two runs


def test_pfc_pauses_a_victim_spread_over_hops_and_ecn_cuts_them(tmp_path):
    resolved = load("pfc-demo", {"results_dir": str(tmp_path), "params.alone_s": 3,
                                 "params.contention_s": 15})
    outcome = run_scenario(resolved, log=print)
    results = outcome.summary["results"]
    assert list(results) == list(CONDITIONS)
    for check in outcome.verdict.checks:
        print(f"{check.outcome} {check.setup} {check.name}: {check.statement}")
    lossy, pfc, both = results[LOSSY], results[PFC], results[PFC_ECN]
    assert not any(r["errors"] for r in results.values()), [r["errors"] for r in
                                                            results.values()]
    assert lossy["queue_drops"] > 0, "the lossy run's incast must overflow its queue"
    assert pfc["queue_drops"] == 0, "PFC: no queue anywhere may drop the lossless class"
    assert pfc["pause_frames_sent"] > 0 and both["ce_marks"] > 0
    assert len(outcome.verdict.checks) == CHECKS_PER_RUN
    assert [c for c in outcome.verdict.checks if c.outcome != "PASS"] == []
    assert outcome.verdict.emulator_trusted, outcome.verdict.reasons
    assert outcome.exit_status() == 0
    assert (outcome.workdir / "plots" / "pfc-demo.png").exists()
