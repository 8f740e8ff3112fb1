"""Judging what a run did against the outcome its row of the table promises (pure): what the
suite observed of one run (``Observation``) becomes a ``TrialVerdict`` (held or not, and why;
whether its data was verified, or wrongly claimed verified; what it left), and every trial's
verdict the suite's (``suite_verdict``).

"Verified" is what the run itself claims: status complete and every integrity check of its
workload PASS (for a workload without one, every check). A run whose row promises a failure
and that still claims verified data, or exits 0, counts as **wrongly verified**: the number
the suite holds at 0.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from testbed.apply.state import PHASES
from testbed.chaos.leftovers import count as count_leftovers
from testbed.chaos.leftovers import describe as describe_leftovers
from testbed.chaos.table import (
    BASELINE,
    FAILED_LOUDLY,
    FAULTS,
    FAULTS_BY_KEY,
    PASSES,
    RECOVERED,
    REFUSED,
    SURVIVED,
)
from testbed.errors import EXIT_OK, EXIT_RUN_FAILED, EXIT_VERDICT

ENDED = "ended"  # a SIGKILL that came after the run had removed its ledger


@dataclass
class Observation:
    """What the suite saw of one run: its exit status (None when the suite killed it, or
    ended it as hung), how long it took, its stderr, its summary.json (None without one),
    what it left in its results folder, what it left on the machine (testbed.chaos
    .leftovers), and for a SIGKILL the phase the ledger named when it landed, how `testbed
    clean` exited and the plain run after it."""

    exit_status: int | None
    elapsed_s: float
    stderr: str = ""
    summary: dict | None = None
    created: list[str] = field(default_factory=list)
    leftovers: dict = field(default_factory=dict)
    hung: bool = False
    landed: str | None = None
    clean_status: int | None = None
    next_run: Observation | None = None


@dataclass
class TrialVerdict:
    held: bool
    observed: str
    reasons: list[str] = field(default_factory=list)
    verified: bool = False
    wrongly_verified: bool = False
    leftovers: int = 0


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def check_outcomes(summary: dict | None) -> dict[str, str]:
    """Check name -> PASS, FAIL or n/a, from a summary's verdict."""
    verdict = (summary or {}).get("verdict") or {}
    return {c["name"]: c["outcome"] for c in verdict.get("checks", [])}


def claims_verified(summary: dict | None, integrity: tuple[str, ...]) -> bool:
    """Whether a run says its data is verified: complete, and every integrity check (every
    check, when the workload names none) PASS."""
    if not summary or summary.get("status") != "complete":
        return False
    outcomes = check_outcomes(summary)
    wanted = integrity or tuple(outcomes)
    return bool(wanted) and all(outcomes.get(name) == "PASS" for name in wanted)


def schedule_problems(summary: dict | None) -> list[str]:
    """Steps of the failure schedule that failed, and faults never healed."""
    problems = []
    for setup, result in ((summary or {}).get("results") or {}).items():
        for record in result.get("failures", []):
            if "error" in record:
                problems.append(f"{setup}: {record['event']} failed: {record['error']}")
        for window in result.get("fault_windows", []):
            if window["end_monotonic_s"] is None:
                problems.append(f"{setup}: {window['fault']} was never healed")
    return problems


def observed_text(obs: Observation) -> str:
    """A short account of what happened, for the table."""
    if obs.landed is not None:
        text = (f"killed in {obs.landed}" if obs.landed != ENDED else "not killed: the run "
                "had ended") + f", clean exit {obs.clean_status}"
        if obs.next_run is not None:
            text += f", next run exit {obs.next_run.exit_status}"
        return text
    if obs.hung:
        return f"hung: ended by the suite after {obs.elapsed_s:.0f} s"
    lines = error_lines(obs.stderr)
    text = f"exit {obs.exit_status} after {obs.elapsed_s:.0f} s"
    if obs.exit_status not in (EXIT_OK, EXIT_VERDICT) and lines:
        text += ": " + lines[-1].removeprefix("testbed: error: ")[:90]
    return text


def judge(trial, obs: Observation, integrity: tuple[str, ...]) -> TrialVerdict:
    """Whether ``obs`` is the outcome ``trial`` (testbed.chaos.plan.Trial) must have, with
    every reason it is not."""
    verified = claims_verified(obs.summary, integrity)
    reasons: list[str] = []
    left = count_leftovers(obs.leftovers)
    if left:
        reasons.append(f"left behind: {describe_leftovers(obs.leftovers)}")
    if obs.hung:
        reasons.append(f"did not end within {trial.within_s:.0f} s (ended as hung)")
    expected = trial.expected
    if expected == RECOVERED and obs.landed == ENDED:
        # the SIGKILL came after the run had ended: nothing was injected, so the run must
        # simply have passed (the suite counts only kills that landed towards each phase)
        expected = PASSES
    if expected == PASSES:
        if obs.exit_status != EXIT_OK:
            reasons.append(f"exit {obs.exit_status}, not 0")
        if not verified:
            reasons.append("data not verified")
    elif expected == SURVIVED:
        if obs.exit_status not in (EXIT_OK, EXIT_VERDICT):
            reasons.append(f"exit {obs.exit_status}: the run did not complete")
        if not verified:
            reasons.append("data not verified")
        reasons += schedule_problems(obs.summary)
    elif expected in (FAILED_LOUDLY, REFUSED):
        reasons += loud_problems(trial, obs)
        if expected == REFUSED and obs.created:
            reasons.append(f"created {', '.join(obs.created[:3])} in the results folder")
    elif expected == RECOVERED:
        reasons += recovery_problems(obs, integrity)
    wrongly = expected not in (PASSES, SURVIVED) and (obs.exit_status == EXIT_OK or verified)
    if wrongly:
        reasons.append("reported as verified (exit 0 or verified data) though it must fail")
    if expected == RECOVERED:
        verified = obs.next_run is not None and claims_verified(obs.next_run.summary, integrity)
    return TrialVerdict(not reasons, observed_text(obs), reasons, verified, wrongly, left)


def loud_problems(trial, obs: Observation) -> list[str]:
    """Why a run that must fail loudly did not: exit 3, in time, one line naming the fault."""
    problems = []
    if obs.exit_status != EXIT_RUN_FAILED and not obs.hung:
        problems.append(f"exit {obs.exit_status}, not 3")
    if obs.elapsed_s > trial.within_s:
        problems.append(f"took {obs.elapsed_s:.0f} s, more than its {trial.within_s:.0f} s")
    lines = error_lines(obs.stderr)
    pattern = FAULTS_BY_KEY[trial.fault].names
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr, not one"
                        + (f" (first: {lines[0][:100]})" if lines else ""))
    if pattern and not any(re.search(pattern, line) for line in lines):
        problems.append(f"no line on stderr names what died (/{pattern}/)")
    return problems


def recovery_problems(obs: Observation, integrity: tuple[str, ...]) -> list[str]:
    """Why a killed run was not recovered: `testbed clean` failed or left something (the
    leftovers are measured after it), or the next run did not pass."""
    problems = []
    if obs.clean_status != EXIT_OK:
        problems.append(f"testbed clean exited {obs.clean_status}")
    nxt = obs.next_run
    if nxt is None:
        problems.append("no run after the clean-up")
        return problems
    if nxt.exit_status != EXIT_OK or not claims_verified(nxt.summary, integrity):
        problems.append(f"the next run did not pass: {observed_text(nxt)}")
    if count_leftovers(nxt.leftovers):
        problems.append(f"the next run left behind: {describe_leftovers(nxt.leftovers)}")
    return problems


# --- the suite --------------------------------------------------------------------------------


@dataclass
class SuiteVerdict:
    passed: bool
    reasons: list[str]
    counts: dict
    kills: dict


def suite_verdict(plan, done: list[tuple], wall_s: float, not_run: list) -> SuiteVerdict:
    """The suite's verdict from ``done`` ((trial, TrialVerdict, Observation) in run order)
    and the trials ``not_run`` (over the budget): every trial held, nothing wrongly
    verified, nothing left, the SIGKILLs landed in every phase as often as the profile asks,
    at least one survivable fault verified, every row of the table run, and within the
    budget."""
    profile = plan.profile
    verdicts = [v for _, v, _ in done]
    kills = Counter(obs.landed for t, _, obs in done if t.kill_phase is not None)
    faults = [t for t, _, _ in done if t.fault != BASELINE]
    counts = {
        "runs": len(done),
        "faults_injected": len(faults),
        "as_expected": sum(v.held for t, v, _ in done if t.fault != BASELINE),
        "not_as_expected": sum(not v.held for v in verdicts),
        "wrongly_verified": sum(v.wrongly_verified for v in verdicts),
        "leftovers": sum(v.leftovers for v in verdicts),
        "survived_verified": sum(v.verified for t, v, _ in done if t.expected == SURVIVED),
        "not_run": len(not_run),
    }
    reasons = []
    if counts["not_as_expected"]:
        reasons.append(f"{counts['not_as_expected']} runs did not have their expected outcome")
    if counts["wrongly_verified"]:
        reasons.append(f"{counts['wrongly_verified']} runs reported data verified that must fail")
    if counts["leftovers"]:
        reasons.append(f"{counts['leftovers']} things left behind")
    for phase in PHASES:
        if kills.get(phase, 0) < profile.kills_per_phase:
            reasons.append(f"{kills.get(phase, 0)} SIGKILLs landed in {phase}, "
                           f"{profile.kills_per_phase} needed")
    if not counts["survived_verified"]:
        reasons.append("no survivable fault ended with its data verified")
    ran = {t.fault for t, _, _ in done}
    missing = [f.key for f in FAULTS if f.key not in ran]
    if missing:
        reasons.append(f"rows never run: {', '.join(missing)}")
    if not_run:
        reasons.append(f"{len(not_run)} runs not started: the suite was over its "
                       f"{profile.budget_s / 60:.0f} minutes")
    if wall_s > profile.budget_s:
        reasons.append(f"took {wall_s / 60:.1f} minutes, over its {profile.budget_s / 60:.0f}")
    return SuiteVerdict(not reasons, reasons, counts, {p: kills.get(p, 0) for p in PHASES})


def row_summaries(done: list[tuple]) -> list[dict]:
    """One entry per row of the table (and the plain runs), in the table's order: its
    expected outcome, trials run, how many held, what was seen, what was left."""
    rows = []
    for key, fault, expected in [(BASELINE, "a plain run, before any fault", PASSES),
                                 *((f.key, f.fault, f.expected) for f in FAULTS)]:
        mine = [(t, v, o) for t, v, o in done if t.fault == key]
        seen = Counter(f"exit {o.exit_status}" if o.landed is None else f"killed in {o.landed}"
                       for _, _, o in mine)
        rows.append({"fault": key, "what": fault, "expected": expected, "runs": len(mine),
                     "held": sum(v.held for _, v, _ in mine),
                     "observed": ", ".join(f"{k} x{n}" for k, n in seen.most_common()),
                     "wrongly_verified": sum(v.wrongly_verified for _, v, _ in mine),
                     "leftovers": sum(v.leftovers for _, v, _ in mine)})
    return rows
