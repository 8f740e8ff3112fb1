"""`testbed chaos --profile ci` end to end on this machine (root; about 10 minutes): every
row of the fault table ends as the table says, nothing is wrongly reported verified, nothing
is left behind after any fault, a SIGKILL lands in each phase and is recovered by `testbed
clean`, at least one survivable fault ends verified, and the profile keeps to its 10 minutes.
The suite's own summary.json is what is checked; the machine is checked clean after it."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import REPO, assert_clean

from testbed.chaos.plan import PROFILES
from testbed.chaos.table import FAULTS

SEED = 1
CI_BUDGET_S = PROFILES["ci"].budget_s
SUITE_TIMEOUT_S = CI_BUDGET_S + 300  # the suite stops itself at its budget; this is a backstop


def test_the_ci_profile_holds_every_row_and_leaves_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "testbed", "chaos", "--profile", "ci", "--seed",
                          str(SEED), "--results", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=SUITE_TIMEOUT_S)
    (folder,) = tmp_path.glob(f"chaos-*-seed{SEED}")
    summary = json.loads((folder / "summary.json").read_text())
    print(out.stdout[-6000:])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr
    assert summary["passed"] and summary["reasons"] == []
    counts = summary["counts"]
    assert counts["wrongly_verified"] == 0 and counts["leftovers"] == 0
    assert counts["as_expected"] == counts["faults_injected"] >= len(FAULTS)
    assert counts["survived_verified"] >= 1
    assert all(n >= PROFILES["ci"].kills_per_phase for n in summary["kills"].values())
    rows = {row["fault"]: row for row in summary["rows"]}
    assert all(rows[f.key]["runs"] >= 1 and rows[f.key]["held"] == rows[f.key]["runs"]
               for f in FAULTS)
    assert summary["wall_s"] <= CI_BUDGET_S
    assert "PASSED" in out.stdout and f"--seed {SEED}" in out.stdout
    assert_clean()
