"""The suite's summary (testbed.chaos.suite.Suite.write) for people: the table printed at the
end of ``testbed chaos``, one row per row of the fault table, and the lines under it (pure)."""
from __future__ import annotations

HEADER = ["fault", "expected", "runs", "held", "observed", "wrongly verified", "left behind"]


def report_rows(summary: dict) -> list[list[str]]:
    """The table: a header, then a row per fault (rows never run show 0 runs)."""
    rows = [HEADER]
    for row in summary["rows"]:
        rows.append([row["fault"], row["expected"], str(row["runs"]),
                     f"{row['held']}/{row['runs']}", row["observed"] or "-",
                     str(row["wrongly_verified"]), str(row["leftovers"])])
    return rows


def report_lines(summary: dict) -> list[str]:
    """What the table does not show: the SIGKILLs per phase, the totals, the verdict and
    its reasons, and where the summary is."""
    counts, kills = summary["counts"], summary["kills"]
    lines = [
        "SIGKILLs landed: " + ", ".join(f"{phase} {n}" for phase, n in kills.items())
        + f" ({summary['kills_per_phase']} needed in each)",
        f"faults injected {counts['faults_injected']}, as expected {counts['as_expected']}, "
        f"wrongly reported verified {counts['wrongly_verified']}, things left behind "
        f"{counts['leftovers']}, survivable faults with data verified "
        f"{counts['survived_verified']}",
        f"seed {summary['seed']}, profile {summary['profile']}: {summary['wall_s'] / 60:.1f} of "
        f"{summary['budget_s'] / 60:.0f} minutes (repeat: {summary['command']})",
    ]
    for trial in summary["trials"]:
        if not trial["held"]:
            lines.append(f"  {trial['name']}: {trial['observed']}: {'; '.join(trial['reasons'])}")
    if summary["passed"]:
        lines.append("PASSED: every run had its expected outcome")
    else:
        lines.append("FAILED: " + "; ".join(summary["reasons"]))
    return lines


def plan_rows(plan) -> list[list[str]]:
    """A plan (testbed.chaos.plan.SuitePlan) as a table, for ``testbed chaos --plan``."""
    rows = [["run", "workload", "expected", "fault", "estimate"]]
    for t in plan.trials:
        if t.kill_phase is not None:
            what = f"SIGKILL at {t.kill_fraction:.0%} of {t.kill_phase}" + (
                " (spare)" if t.spare else "")
        elif t.failures:
            what = "; ".join(", ".join(f"{k}: {v}" for k, v in entry.items())
                             for entry in t.failures)
        else:
            what = t.setup or "-"
        rows.append([t.name, t.workload, t.expected, what, f"{t.estimate_s:.0f} s"])
    return rows
