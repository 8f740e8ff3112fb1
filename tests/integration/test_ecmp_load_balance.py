"""ECMP on the wire, as ``scenarios/ecmp-hedera.yaml`` runs it, shortened to strides 4 and 8
and 4 s per pattern: Hedera's ordering (non-blocking >= ECMP > single-path) on the k=4
fat-tree, ECMP's gap beside Hedera's hardware figures, and 64 TCP flows from edge switch p0e0
spread over its uplinks by OVS select groups (Jain index) while single-path routing puts them
all on one (testbed.experiments.hedera). Every check the run judges must pass (the shape
check is not judged: it compares strides of different layers, and both strides here climb to
the core), and the run must be trusted: the non-blocking reference at 85% of its host links,
every flow to its end, and each setup's fidelity verdict over its measured windows."""
from __future__ import annotations

from testbed.harness.run import run_scenario
from testbed.experiments.registry import load

PATTERNS = ["stride4", "stride8"]
SHORTENED = {"params.patterns": PATTERNS, "params.seconds": 4, "params.omit_s": 1}


def test_ecmp_trails_the_non_blocking_switch_beats_single_path_and_spreads(tmp_path):
    resolved = load("ecmp-hedera", {**SHORTENED, "results_dir": str(tmp_path)})
    outcome = run_scenario(resolved, log=print)
    for row in outcome.summary["rows"]:
        print(f"{row['what']}: {row['text']}")
    checks = {c.name: c for c in outcome.verdict.checks}
    for pattern in PATTERNS:
        for claim in ("non-blocking >= ECMP", "ECMP > single-path",
                      "ECMP / non-blocking beside Hedera's"):
            check = checks[f"{pattern}: {claim}"]
            assert check.passed, check
    assert checks["the gap opens as flows climb the tree"].passed is None
    assert checks["uplink spread: Jain index under ECMP"].passed, checks
    assert checks["uplink spread: busiest uplink's share under single-path"].passed, checks
    results = outcome.summary["results"]
    assert results["ecmp"]["spread"]["flows"] == 64
    assert "spread" not in results["nonblocking"]
    assert outcome.verdict.emulator_trusted, outcome.verdict.reasons
    assert outcome.exit_status() == 0
