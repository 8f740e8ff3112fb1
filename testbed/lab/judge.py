"""A lab's self-check judged against its runs' summary.json: pure, from plain data.

Every item ends PASS, FAIL or "not judged". An item is not judged when its run is missing,
did not complete, measured nothing where the item looks, or was not trusted (the emulator
did not keep up): a number the emulator may have bent decides nothing either way, so an
item on an untrusted run is never PASS (and never FAIL), and its line says what it would
have been. A self-check passes only when every item passed.

Reading a summary is defensive: only ``status``, ``error``, ``verdict`` (``checks``:
name, setup, measured, expected, passed; ``emulator_trusted``, ``reasons``), ``results``,
``params``, ``ecn_path`` and ``provenance.paths`` are read, each where it is expected and
reported by path where it is not.
"""
from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field

from testbed.harness.report import _cell as show  # a number as every report shows it
from testbed.lab.spec import PATH_KEYS, Condition, Item, Lab
from testbed.lab.values import Missing, evaluate, lookup, split_run
from testbed.model.verdict import FAIL, PASS

NOT_JUDGED = "not judged"
WILDCARDS = "*?["


@dataclass(frozen=True)
class Judged:
    """One condition's outcome, the number behind it and why."""

    outcome: str
    measured: str = "-"
    expected: str = "-"
    reason: str = ""


@dataclass(frozen=True)
class ItemResult:
    """One item of a self-check, judged."""

    name: str
    run: str
    outcome: str
    measured: str
    expected: str
    reason: str = ""
    why: str = ""


@dataclass
class SelfCheck:
    """Every item of a lab's self-check, judged on the runs in ``run_dirs`` (run name ->
    run folder)."""

    lab: str
    title: str
    items: list[ItemResult]
    run_dirs: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.items) and all(i.outcome == PASS for i in self.items)

    def counts(self) -> dict[str, int]:
        outcomes = [i.outcome for i in self.items]
        return {o: outcomes.count(o) for o in (PASS, FAIL, NOT_JUDGED)}

    def headline(self) -> str:
        c = self.counts()
        return (f"lab {self.lab}: {'PASSED' if self.passed else 'NOT PASSED'}: {c[PASS]} of "
                f"{len(self.items)} items passed, {c[FAIL]} failed, {c[NOT_JUDGED]} not judged")

    def rows(self) -> list[list[str]]:
        """The items as a table, header first."""
        return [["outcome", "item", "run", "measured", "expected", "why / reason"],
                *([i.outcome, i.name, i.run, i.measured, i.expected,
                   "; ".join(x for x in (i.reason, i.why) if x)] for i in self.items)]

    def to_dict(self) -> dict:
        return {"lab": self.lab, "title": self.title, "passed": self.passed,
                "counts": self.counts(), "run_dirs": self.run_dirs,
                "items": [asdict(i) for i in self.items]}


def judge(lab: Lab, summaries: dict[str, dict], run_dirs: dict[str, str] | None = None
          ) -> SelfCheck:
    """Every item of ``lab``'s check file against ``summaries`` (run name -> summary.json)."""
    items = [judge_item(item, lab.run_for(item).name, summaries) for item in lab.checks.items]
    return SelfCheck(lab.name, lab.title, items, dict(run_dirs or {}))


def judge_item(item: Item, run: str, summaries: dict[str, dict]) -> ItemResult:
    """One item on its run's summary (and those of the other runs it reads)."""
    missing = sorted(r for r in {run, *item.other_runs()} if r not in summaries)
    if missing:
        return ItemResult(item.name, run, NOT_JUDGED, "-", "-", f"no summary of run "
                          f"{', '.join(missing)}", item.why)
    judged = [judge_condition(c, summaries[run], summaries) for c in item.conditions]
    outcome = (FAIL if any(j.outcome == FAIL for j in judged) else
               NOT_JUDGED if any(j.outcome == NOT_JUDGED for j in judged) else PASS)
    measured = "; ".join(j.measured for j in judged)
    expected = "; ".join(j.expected for j in judged)
    reason = "; ".join(j.reason for j in judged if j.reason)
    doubt = "; ".join(f"{r}: {d}" if r != run else d
                      for r in [run, *sorted(item.other_runs() - {run})]
                      for d in [run_doubt(summaries[r])] if d)
    if doubt:  # the numbers are not to be relied on: judged neither way
        reason = f"{doubt} (would be {outcome}{': ' + reason if reason else ''})"
        outcome = NOT_JUDGED
    return ItemResult(item.name, run, outcome, measured, expected, reason, item.why)


def run_doubt(summary: dict) -> str:
    """Why a run's numbers decide nothing: it did not complete, or the emulator did not keep
    up; empty when they do."""
    status = summary.get("status")
    if status != "complete":
        error = summary.get("error")
        return f"the run is {status or 'of unknown status'}" + (f": {error}" if error else "")
    verdict = summary.get("verdict") or {}
    if verdict.get("emulator_trusted") is not True:
        reasons = verdict.get("reasons") or ["no trust verdict in summary.json"]
        return "the emulator did not keep up: " + "; ".join(reasons)
    return ""


def judge_condition(condition: Condition, summary: dict, summaries: dict[str, dict]) -> Judged:
    """One condition on ``summary`` (its item's run); a value may come from another run's."""
    if condition.check is not None:
        return judge_check(condition.check, condition.setup, summary)
    return judge_value(condition, summary, summaries)


def judge_check(name: str, setup: str | None, summary: dict) -> Judged:
    """The run's own checks named ``name`` (a pattern when it has * ? or [), on ``setup``
    when given: PASS when every one passed."""
    checks = (summary.get("verdict") or {}).get("checks") or []
    pattern = any(ch in name for ch in WILDCARDS)
    found = [c for c in checks if isinstance(c, dict)
             and (fnmatch.fnmatchcase(str(c.get("name")), name) if pattern else c.get("name") == name)
             and (setup is None or c.get("setup") == setup)]
    where = f"check {name!r}" + (f" on setup {setup!r}" if setup else "")
    if not found:
        return Judged(FAIL, reason=f"the run has no {where}")
    measured = ", ".join(show(c.get("measured")) for c in found)
    expected = ", ".join(show(c.get("expected")) for c in found)
    passed = [c.get("passed") for c in found]
    if any(p is False for p in passed):
        return Judged(FAIL, measured, expected, f"{where} failed")
    if any(p is not True for p in passed):
        return Judged(NOT_JUDGED, measured, expected, f"the run did not judge {where}")
    return Judged(PASS, measured, expected)


def judge_value(condition: Condition, summary: dict, summaries: dict[str, dict]) -> Judged:
    """An expression over values of the summary (or another run's, ``RUN:path``), within its
    bounds (those of the paths the run took, where ``by_path`` states them) or true."""
    values = {}
    for name, path in condition.names.items():
        other = split_run(path)[0]
        try:
            values[name] = lookup(summary if other is None else summaries[other], path)
        except Missing as exc:
            return Judged(FAIL, reason=f"summary.json has no {path} ({exc})")
        if values[name] is None:
            return Judged(NOT_JUDGED, reason=f"nothing was measured at {path}")
    low, high, note = bounds_for(condition, summary)
    expected = expected_text(low, high, note) if condition.bounded else "true"
    try:
        result = evaluate(condition.expression, values)
    except ArithmeticError as exc:
        return Judged(NOT_JUDGED, expected=expected, reason=f"cannot compute "
                                                            f"{condition.expression}: {exc}")
    except (TypeError, ValueError) as exc:
        return Judged(FAIL, expected=expected, reason=f"cannot compute "
                                                      f"{condition.expression}: {exc}")
    if not condition.bounded:
        if not isinstance(result, bool):
            return Judged(FAIL, show(result), expected, f"{condition.expression} is not a "
                                                        "yes/no claim; give min or max")
        return Judged(PASS if result else FAIL, show(result), expected)
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        return Judged(FAIL, show(result), expected, f"{condition.expression} is not a number")
    ok = (low is None or result >= low) and (high is None or result <= high)
    return Judged(PASS if ok else FAIL, show(result), expected)


def run_paths(summary: dict) -> dict[str, str | None]:
    """The path a run took for each feature a check file's ``by_path`` can name."""
    taken = {}
    for name, places in PATH_KEYS.items():
        taken[name] = None
        for place in places:
            try:
                value = lookup(summary, place)
            except Missing:
                continue
            if value is not None:
                taken[name] = str(value)
                break
    return taken


def bounds_for(condition: Condition, summary: dict) -> tuple[float | None, float | None, str]:
    """(min, max, which paths chose them) for this run: the first ``by_path`` entry whose
    paths the run took, else the condition's own."""
    taken = run_paths(summary)
    for entry in condition.by_path:
        if all(taken.get(k) == v for k, v in entry.when.items()):
            paths = ", ".join(f"{k} {v}" for k, v in entry.when.items())
            return entry.min, entry.max, paths + (f": {entry.note}" if entry.note else "")
    return condition.min, condition.max, ""


def expected_text(low: float | None, high: float | None, note: str = "") -> str:
    if low is not None and high is not None:
        text = f"{show(low)} .. {show(high)}"
    elif low is not None:
        text = f">= {show(low)}"
    else:
        text = f"<= {show(high)}"
    return f"{text} ({note})" if note else text

